"""Phase ``attribute``: RecUP-FL's attribute inference (Cui et al., §5.4) against one
setting's uploads, every adversary at every ``attribute.rounds`` round.

The adversaries learn from clean max-pooled gradients of D_train (the strongest adversary:
it knows the defenders' training set, §5.4); D_test are uploads of client samples (the
train split, ``attribute.batch_size`` per upload) made as FL clients make theirs, through
the setting's defense. ASR is the adversary's accuracy on D_test; the setting's learning
loss is its FL run's final test loss (§5.5).

With ``attribute.adaptive`` (decision 0072) every adversary is also fitted on D_train's
*defended* uploads: each public upload made as a client makes its own
(``fl.client_context`` through the setting's defense), the defense's randomness drawn from
a seed of its own (``seeds``' ``public``, not the victims'). That defense-aware adversary
(``attacker`` ``adaptive``) attacks the same client uploads as the paper's (``attacker``
``paper``), which learns from clean gradients (§5.4: it assumes nothing of the defense).
It depends on the setting, so it is fitted in the job, not saved. Under ``none`` with one
local step the defended upload is the clean gradient: the adaptive adversary is the
paper's and its rows are the paper's, reused.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gradleak import adversaries, data
from gradleak.adversaries.features import gradient_features
from gradleak.experiment import artifacts, cost, paths, plan
from gradleak.experiment.attribute_samples import (
    ADVERSARIES_FORMAT,
    majority,
    model_digest,
    started,
    train_features,
    with_attributes,
)
from gradleak.experiment.job import Job, model_at
from gradleak.experiment.phase import Output, Phase, by_model
from gradleak.fl import batch_schedule, client_context, rows_of
from gradleak.settings import ADAPTIVE, PAPER, Setting
from gradleak.types import Update
from gradleak.utils.io import REMEDY, ArtifactError, load_torch, read_json, write_json

UPLOADS_TOGETHER = 100  # uploads a defense makes at once (Defense.many; RecUP-FL shares work)


def _saved_adversaries(path: Path, model: torch.nn.Module) -> dict:
    """The fitted states in ``path``; ArtifactError unless they learnt under ``model``."""
    saved = load_torch(path)
    if not isinstance(saved, dict) or saved.get("format") != ADVERSARIES_FORMAT:
        raise ArtifactError(f"{path} is not a file of fitted adversaries (expected format "
                            f"{ADVERSARIES_FORMAT!r}); {REMEDY}")
    if saved["model"] != model_digest(model):
        raise ArtifactError(f"{path} holds adversaries that learnt under another model than "
                            f"this job's; {REMEDY}")
    return saved["fitted"]


def upload_features(job: Job, model: torch.nn.Module, samples: data.ImageData, round_: int,
                    seed: int, desc: str = "") -> tuple[torch.Tensor, dict[str, np.ndarray],
                                                         list[float]]:
    """Features of each defended upload of ``samples`` (``attribute.batch_size`` per upload:
    D_test, or D_train for the adaptive adversary), its attribute labels and the defense's
    time per upload; upload g's defense draws from ``seed + g``, whichever uploads it is
    made with."""
    spec, fl = job.config["attribute"], job.resolved["fl"]
    defense = artifacts.build_defense(Job(job.config, job.results, job.case, job.setting,
                                          job.seed, zoo_round=round_), model)
    size = spec["batch_size"]
    features, labels, seconds = [], {a: [] for a in samples.attributes}, []
    groups = len(samples) // size
    with tqdm(total=groups, desc=f"{desc}{job.setting} round {round_}", unit="upload",
              leave=False) as progress:
        for first in range(0, groups, UPLOADS_TOGETHER):
            parts = [samples.subset(torch.arange(g * size, (g + 1) * size))
                     for g in range(first, min(first + UPLOADS_TOGETHER, groups))]
            start = time.perf_counter()
            steps = [batch_schedule(size, fl["local_steps"], fl["local_epochs"],
                                    fl["client_batch_size"], np.random.default_rng(seed + g))
                     for g in range(first, first + len(parts))]
            uploads = defense.many([client_context(
                model, lambda k, b=(part.x, part.y, part.attributes), s=rows: rows_of(b, s[k]),
                len(rows), fl["local_lr"], torch.Generator().manual_seed(seed + g))
                for (g, part), rows in zip(enumerate(parts, first), steps)])
            seconds += [(time.perf_counter() - start) / len(parts)] * len(parts)
            for part, upload in zip(parts, uploads):
                features.append(gradient_features(Update(upload).detached(),
                                                  spec["feature_size"]))
                for a, values in part.attributes.items():
                    labels[a].append(majority(values))
            progress.update(len(parts))
    return torch.stack(features), {a: np.array(v) for a, v in labels.items()}, seconds


def run_attribute(config: dict, results: Path, case: str, setting: Setting, seed: int) -> None:
    """Every adversary against one setting's uploads at every ``attribute.rounds``."""
    if (case, setting) not in plan.attribute_jobs(config):
        raise ValueError(f"setting {setting.text!r} of case {case!r} has no attribute job; "
                         f"`gradleak plan` lists the planned settings")
    job, spec, names, own, device, public = started(config, results, case, setting, seed)
    train = data.load_prepared(job.data_dir, "train")
    count = min(spec["test_samples"] * spec["batch_size"], len(train))
    chosen = np.random.default_rng(own["samples"]).choice(len(train), count, replace=False)
    d_test = with_attributes(train.subset(torch.from_numpy(chosen)), names).to(device)
    fl_run = read_json(job.fl_dir / "metrics.json")
    refitted = [n for n in spec["adversaries"] if not adversaries.build(n).savable]
    # the adaptive adversary learns from D_train's defended uploads, except where they are
    # the clean gradients the paper's adversary learns from (no defense, one local step)
    reused = plan.defense_of(job.resolved, setting)[0] == plan.NONE.defense and \
        job.resolved["fl"]["local_steps"] == 1 and not job.resolved["fl"]["local_epochs"]
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
            train_x, train_labels = train_features(model, public, spec)
        test_x, test_labels, seconds = upload_features(job, model, d_test, round_, own["defense"])
        times += seconds
        if spec["adaptive"] and not reused:
            public_x, public_labels, seconds = upload_features(job, model, public, round_,
                                                        own["public"], desc="public ")
            public_times += seconds
        for attribute in names:
            chance = float(np.bincount(test_labels[attribute]).max() / len(test_x))
            for name in spec["adversaries"]:
                adversary = adversaries.build(name, seed=own["adversary"]).to(device)
                if name in refitted:
                    adversary.fit(train_x, train_labels[attribute])
                else:
                    adversary.restore(saved[attribute][name])
                asr = float(np.mean(adversary.predict(test_x) == test_labels[attribute]))
                scores = {PAPER: asr}
                if spec["adaptive"]:
                    if not reused:
                        adversary = adversaries.build(name, seed=own["adversary"]).to(
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



def _inputs(config: dict, results: Path, job: dict) -> list[Path]:
    """The case's data, the setting's FL run (its checkpoints at attribute.rounds and its
    learning loss) and the fitted adversaries it uses at each of its rounds."""
    case, setting, seed = job["case"], job["setting"], job["seed"]
    fl = paths.fl_dir(results, case, setting, seed)
    rounds = plan.resolve(config, setting)["attribute"]["rounds"]
    return [paths.data_manifest(results, plan.find_case(config, case)["dataset"]),
            fl / "metrics.json", *(fl / f"round{r}.pt" for r in config["attribute"]["rounds"]),
            *(paths.adversaries_file(results, case, plan.adversary_setting(setting, r), seed, r)
              for r in rounds)]


def _params(config: dict, results: Path, job: dict) -> dict:
    """What an attribute job reads from the configuration."""
    resolved = plan.resolve(config, job["setting"])
    return {"attribute": resolved["attribute"], "fl": resolved["fl"],
            "defense": plan.defense_of(resolved, job["setting"])}


def _work(config: dict, results: Path, job: dict) -> dict[str, int]:
    """The per-sample gradients of its samples at every round (with ``attribute.adaptive``
    D_train's defended uploads too)."""
    spec = plan.resolve(config, job["setting"])["attribute"]
    uploads = spec["train_samples"] + spec["test_samples"] \
        + spec["train_samples"] * spec["adaptive"]
    return {cost.model_unit(config, results, job["case"], "fl_step", 1):
            uploads * len(spec["rounds"])}


PHASE = Phase(
    name="attribute",
    summary="attribute-inference adversaries against one setting's uploads",
    wildcards=("case", "setting", "seed"),
    folders=("attribute",),
    reads=("prepare_data", "train_evalnet", "train_zoo", "fl_run", "fit_adversaries"),
    outputs=lambda config, results, jobs=None: {"metrics": Output(paths.attribute_metrics(
        results, "{case}", "{setting}", "{seed}"))},
    run=run_attribute,
    planned=lambda config: [{"case": case, "setting": setting, "seed": seed}
                            for case, setting in plan.attribute_jobs(config)
                            for seed in config["fl"]["seeds"]],
    inputs=_inputs,
    artifacts=lambda config, results, job: list(
        artifacts.defense_needs(Job.of(config, results, job)).values()),
    params=_params,
    gpu=by_model,
    work=_work,
    startup="startup:gradients",
    priority=artifacts.trained_first,
)
