"""RecUP-FL's attribute-inference track (Cui et al., §5.4) as two pipeline phases.

- :func:`train_zoo`: the defender models of one case at one round, trained on clean
  gradients of D_train (the public split) under the undefended run's model at that round.
- :func:`fit_adversaries`: the adversaries that have a saved form (the neural ones, most
  of the fitting time), fitted once per model they learn under and shared by every
  setting whose round's model that is (``plan.adversary_setting``: at round 0, all).
- :func:`run_attribute`: one setting's uploads attacked by every adversary at every round.
  The adversaries learn from clean max-pooled gradients of D_train (the strongest
  adversary: it knows the defenders' training set, §5.4); D_test are uploads of client
  samples (the train split, ``attribute.batch_size`` per upload) made as FL clients make
  theirs, through the setting's defense. ASR is the adversary's accuracy on D_test; the
  setting's learning loss is its FL run's final test loss (§5.5).

  With ``attribute.adaptive`` (issue 33) every adversary is also fitted on D_train's
  *defended* uploads: each public upload made as a client makes its own
  (``fl.client_context`` through the setting's defense, its strength and parameters), the
  defense's randomness drawn from a seed of its own (``_seeds``' ``public``, not the
  victims'). That defense-aware adversary (``attacker`` ``adaptive``) attacks the same
  client uploads as the paper's (``attacker`` ``paper``), which learns from clean gradients
  (§5.4: it assumes nothing of the defense). It depends on the setting, so it is fitted in
  the job, not saved. Under ``none`` with one local step the defended upload is the clean
  gradient: the adaptive adversary is the paper's and its rows are the paper's, reused.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from fedleak import adversaries, data
from fedleak.adversaries.features import features_of, gradient_features
from fedleak.adversaries.zoo import save_zoo
from fedleak.adversaries.zoo import train_zoo as train_defender_zoo
from fedleak.experiment import paths, plan
from fedleak.experiment.artifacts import Job, build_defense
from fedleak.experiment.phases import model_at
from fedleak.fl import client_context
from fedleak.types import ADAPTIVE, PAPER, Setting, Update
from fedleak.utils.device import select
from fedleak.utils.io import REMEDY, ArtifactError, load_torch, read_json, save_torch, write_json
from fedleak.utils.seeding import child_seeds, seed_everything


def _d_train(config: dict, job: Job) -> data.ImageData:
    """D_train: the first ``attribute.train_samples`` of the public split (seeded order)."""
    public = data.load_prepared(job.data_dir, "public")
    count = min(config["attribute"]["train_samples"], len(public))
    order = np.random.default_rng(config["attribute"]["seed"]).permutation(len(public))
    return public.subset(torch.from_numpy(np.sort(order[:count])))


def train_zoo(config: dict, results: Path, case: str, seed: int, round_: int) -> None:
    """The model zoo of ``case`` at ``round_``: ``attribute.zoo_size`` defender models per
    attribute a RecUP-FL setting protects (``plan.zoo_attributes``) on clean gradient
    features of D_train under the undefended model of ``seed``."""
    spec = config["attribute"]
    names = plan.zoo_attributes(config, case)
    if not names:
        raise ValueError(f"case {case!r} has no sensitive attributes to train a zoo for")
    job = Job(config, results, case, plan.NONE, seed)
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    d_train = _d_train(config, job).to(device)
    model = model_at(job, d_train, paths.checkpoint(results, case, plan.NONE, job.seed, round_)
                     ).to(device)
    features = features_of(model, d_train.x, d_train.y, spec["feature_size"])
    zoo = train_defender_zoo(features, {a: d_train.attributes[a] for a in names},
                             {a: data.attribute_classes(job.data_dir)[a] for a in names},
                             size=spec["zoo_size"],
                             epochs=spec["zoo_epochs"], lr=spec["zoo_lr"], seed=spec["seed"])
    save_zoo(paths.zoo_file(results, case, seed, round_), zoo)
    print(f"zoo {case} seed {seed} round {round_}: {spec['zoo_size']} models x {names}",
          file=sys.stderr)


ADVERSARIES_FORMAT = "fedleak.adversaries"


def _seeds(seed: int) -> dict[str, int]:
    """One seed per concern; ``public`` draws the defense's randomness on D_train's uploads
    (the adaptive adversary's training data), apart from the victims' ``defense``."""
    return child_seeds(seed, ["samples", "defense", "adversary", "public"])


def _model_digest(model: torch.nn.Module) -> str:
    """sha256 of the model's weights and buffers (names, dtypes, shapes and values)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def _with_attributes(images: data.ImageData, names: list[str]) -> data.ImageData:
    return data.ImageData(images.x, images.y, images.num_classes,
                          {a: images.attributes[a] for a in names})


def fit_adversaries(config: dict, results: Path, case: str, setting: Setting, seed: int,
                    round_: int) -> None:
    """The savable adversaries of every attribute, fitted on clean features of D_train
    under the round-``round_`` model of ``setting``, with that model's digest."""
    planned = plan.adversary_jobs(config)
    if (case, setting, round_) not in planned:
        raise ValueError(f"no attribute job learns under the round-{round_} model of setting "
                         f"{setting.text!r} of case {case!r}; expected one of "
                         f"{[(c, s.text, r) for c, s, r in planned]}")
    job = Job(config, results, case, setting, seed)
    spec, names, seeds = job.resolved["attribute"], plan.attributes(config, case), _seeds(seed)
    device = select(config["device"])
    seed_everything(seeds["adversary"], config["threads"])
    d_train = _with_attributes(_d_train(config, job), names).to(device)
    model = model_at(job, data.load_prepared(job.data_dir, "train"),
                     paths.checkpoint(results, case, setting, seed, round_)).to(device)
    train_x, train_labels = _train_features(model, d_train, spec)
    savable = [n for n in spec["adversaries"] if adversaries.build(n).savable]
    fitted = {}
    for attribute in tqdm(names, desc="adversaries", unit="attribute", leave=False):
        fitted[attribute] = {
            name: adversaries.build(name, seed=seeds["adversary"]).to(device)
            .fit(train_x, train_labels[attribute]).state() for name in savable}
    save_torch(paths.adversaries_file(results, case, setting, seed, round_),
               {"format": ADVERSARIES_FORMAT, "model": _model_digest(model),
                "fitted": fitted})
    print(f"adversaries {savable} of {case} {setting} seed {seed} round {round_}: fitted on "
          f"{len(train_x)} clean gradients x {names}", file=sys.stderr)


def _saved_adversaries(path: Path, model: torch.nn.Module) -> dict:
    """The fitted states in ``path``; ArtifactError unless they learnt under ``model``."""
    saved = load_torch(path)
    if not isinstance(saved, dict) or saved.get("format") != ADVERSARIES_FORMAT:
        raise ArtifactError(f"{path} is not a file of fitted adversaries (expected format "
                            f"{ADVERSARIES_FORMAT!r}); {REMEDY}")
    if saved["model"] != _model_digest(model):
        raise ArtifactError(f"{path} holds adversaries that learnt under another model than "
                            f"this job's; {REMEDY}")
    return saved["fitted"]


def _majority(values: torch.Tensor) -> int:
    """The most frequent value (the smallest on ties): one upload's attribute label."""
    return int(torch.bincount(values).argmax())


UPLOADS_TOGETHER = 100  # uploads a defense makes at once (Defense.many; RecUP-FL shares work)


def _uploads(job: Job, model: torch.nn.Module, samples: data.ImageData, round_: int,
             seed: int, desc: str = "") -> tuple[torch.Tensor, dict[str, np.ndarray],
                                                  list[float]]:
    """Features of each defended upload of ``samples`` (``attribute.batch_size`` per upload:
    D_test, or D_train for the adaptive adversary), its attribute labels and the defense's
    time per upload; upload g's defense draws from ``seed + g``, whichever uploads it is
    made with."""
    spec, fl = job.config["attribute"], job.resolved["fl"]
    defense = build_defense(Job(job.config, job.results, job.case, job.setting, job.seed,
                                zoo_round=round_), model)
    size = spec["batch_size"]
    features, labels, seconds = [], {a: [] for a in samples.attributes}, []
    groups = len(samples) // size
    with tqdm(total=groups, desc=f"{desc}{job.setting} round {round_}", unit="upload",
              leave=False) as progress:
        for first in range(0, groups, UPLOADS_TOGETHER):
            parts = [samples.subset(torch.arange(g * size, (g + 1) * size))
                     for g in range(first, min(first + UPLOADS_TOGETHER, groups))]
            start = time.perf_counter()
            uploads = defense.many([client_context(
                model, lambda _step, b=(part.x, part.y, part.attributes): b,
                fl["local_steps"], fl["local_lr"], torch.Generator().manual_seed(seed + g))
                for g, part in enumerate(parts, first)])
            seconds += [(time.perf_counter() - start) / len(parts)] * len(parts)
            for part, upload in zip(parts, uploads):
                features.append(gradient_features(Update(upload).detached(),
                                                  spec["feature_size"]))
                for a, values in part.attributes.items():
                    labels[a].append(_majority(values))
            progress.update(len(parts))
    return torch.stack(features), {a: np.array(v) for a, v in labels.items()}, seconds


def _train_features(model: torch.nn.Module, d_train: data.ImageData, spec: dict
                    ) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """Clean features of D_train in uploads of ``attribute.batch_size`` samples."""
    size = spec["batch_size"]
    if size == 1:
        return (features_of(model, d_train.x, d_train.y, spec["feature_size"]),
                {a: v.cpu().numpy() for a, v in d_train.attributes.items()})
    features, labels = [], {a: [] for a in d_train.attributes}
    for g in range(len(d_train) // size):
        part = d_train.subset(torch.arange(g * size, (g + 1) * size))
        features.append(gradient_features(Update.of(model, part.x, part.y).detached(),
                                          spec["feature_size"]))
        for a, values in part.attributes.items():
            labels[a].append(_majority(values))
    return torch.stack(features), {a: np.array(v) for a, v in labels.items()}


def run_attribute(config: dict, results: Path, case: str, setting: Setting, seed: int) -> None:
    """Every adversary against one setting's uploads at every ``attribute.rounds``."""
    if (case, setting) not in plan.attribute_jobs(config):
        raise ValueError(f"setting {setting.text!r} of case {case!r} has no attribute job; "
                         f"`fedleak plan` lists the planned settings")
    job = Job(config, results, case, setting, seed)
    spec, names, seeds = job.resolved["attribute"], plan.attributes(config, case), _seeds(seed)
    device = select(config["device"])
    seed_everything(seeds["adversary"], config["threads"])
    d_train = _with_attributes(_d_train(config, job), names).to(device)
    train = data.load_prepared(job.data_dir, "train")
    count = min(spec["test_samples"] * spec["batch_size"], len(train))
    chosen = np.random.default_rng(seeds["samples"]).choice(len(train), count, replace=False)
    d_test = _with_attributes(train.subset(torch.from_numpy(chosen)), names).to(device)
    fl_run = read_json(job.fl_dir / "metrics.json")
    refitted = [n for n in spec["adversaries"] if not adversaries.build(n).savable]
    # the adaptive adversary learns from D_train's defended uploads, except where they are
    # the clean gradients the paper's adversary learns from (no defense, one local step)
    reused = plan.defense_of(job.resolved, setting)[0] == plan.NONE.defense and \
        job.resolved["fl"]["local_steps"] == 1
    if spec["adaptive"] and reused:
        print(f"adaptive adversaries of {setting}: its uploads are clean gradients, the "
              f"paper's adversaries' rows are reused", file=sys.stderr)
    rows, times, public_times = [], [], []
    for round_ in spec["rounds"]:
        model = model_at(job, train, paths.checkpoint(results, case, job.setting, seed, round_)
                         ).to(device)
        saved = _saved_adversaries(paths.adversaries_file(
            results, case, plan.adversary_setting(setting, round_), seed, round_), model)
        if refitted:
            train_x, train_labels = _train_features(model, d_train, spec)
        test_x, test_labels, seconds = _uploads(job, model, d_test, round_, seeds["defense"])
        times += seconds
        if spec["adaptive"] and not reused:
            public_x, public_labels, seconds = _uploads(job, model, d_train, round_,
                                                        seeds["public"], desc="public ")
            public_times += seconds
        for attribute in names:
            chance = float(np.bincount(test_labels[attribute]).max() / len(test_x))
            for name in spec["adversaries"]:
                adversary = adversaries.build(name, seed=seeds["adversary"]).to(device)
                if name in refitted:
                    adversary.fit(train_x, train_labels[attribute])
                else:
                    adversary.restore(saved[attribute][name])
                asr = float(np.mean(adversary.predict(test_x) == test_labels[attribute]))
                scores = {PAPER: asr}
                if spec["adaptive"]:
                    if not reused:
                        adversary = adversaries.build(name, seed=seeds["adversary"]).to(
                            device).fit(public_x, public_labels[attribute])
                        asr = float(np.mean(adversary.predict(test_x) ==
                                            test_labels[attribute]))
                    scores[ADAPTIVE] = asr
                for attacker, asr in scores.items():
                    rows.append({"adversary": name, "attacker": attacker,
                                 "attribute": attribute, "round": round_, "asr": asr,
                                 "chance": chance, "uploads": len(test_x)})
                    print(f"{name} ({attacker}) vs {setting} round {round_} {attribute}: "
                          f"ASR {asr:.3f} (chance {chance:.3f})", file=sys.stderr)
    write_json(paths.attribute_metrics(results, case, setting, seed), {
        "case": case, "setting": setting.text, "defense": setting.label,
        "strength": setting.strength, "seed": seed, "rows": rows,
        "learning_loss": fl_run["history"][-1]["test_loss"],
        "accuracy": fl_run["final_accuracy"],
        "defense_time_mean": float(np.mean(times)) if times else None,
        "public_defense_time_mean": float(np.mean(public_times)) if public_times else None,
    })
