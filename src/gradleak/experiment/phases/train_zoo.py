"""Phase ``train_zoo``: RecUP-FL's model zoo (Cui et al., §4) of one case at one round,
``attribute.zoo_size`` defender models per protected attribute, trained on clean gradient
features of D_train under the undefended run's model of that seed and round. Declares the
``model_zoo`` artifact, which the ``recupfl`` defense loads."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from gradleak import adversaries, data, defenses
from gradleak.adversaries.features import features_of
from gradleak.adversaries.zoo import save_zoo
from gradleak.adversaries.zoo import train_zoo as train_defender_zoo
from gradleak.experiment import cost, paths, plan
from gradleak.experiment.attribute_samples import clean_attribute_spec, d_train
from gradleak.experiment.job import Job, model_at
from gradleak.experiment.phase import Kind, Output, Phase, always
from gradleak.experiment.resume import Resume
from gradleak.utils.device import select
from gradleak.utils.seeding import seed_everything

ZOO_BATCH = 32  # adversaries.train_zoo's batch
ZOO_WIDTH = 512  # the middle of the widths its defender MLPs draw


def zoo_attributes(config: dict, case: str) -> list[str]:
    """The attributes the zoo of ``case`` is trained for: those the defense of a planned
    setting that loads a zoo protects (its ``attributes``; null: every one of the case's),
    or every one of the case's where none names them."""
    names, protected = plan.attributes(config, case), set()
    for planned, setting in plan.jobs(config):
        name, params = plan.defense_of(config, setting)
        if planned != case or "model_zoo" not in defenses.needs(name, params).values():
            continue
        if params.get("attributes") is None:
            return names
        protected.update(params["attributes"])
    return [a for a in names if a in protected] or names


def train_zoo(config: dict, results: Path, case: str, seed: int, round: int,
              resume: Resume | None = None) -> None:
    """The model zoo of ``case`` at ``round``: ``attribute.zoo_size`` defender models per
    attribute a RecUP-FL setting protects on clean gradient features of D_train under the
    undefended model of ``seed``; with ``resume``, each trained model is kept there and a
    killed job's rerun trains only the others."""
    spec = config["attribute"]
    names = zoo_attributes(config, case)
    if not names:
        raise ValueError(f"case {case!r} has no sensitive attributes to train a zoo for")
    job = Job(config, results, case, plan.NONE, seed)
    device = select(config["device"])
    seed_everything(spec["seed"], config["threads"])
    samples = d_train(config, job.data_dir).to(device)
    model = model_at(job, samples, paths.checkpoint(results, case, plan.NONE, seed, round)
                     ).to(device)
    features = features_of(model, samples.x, samples.y, spec["feature_size"])
    if resume is not None and (kept := resume.kept()):
        print(f"zoo {case} seed {seed} round {round}: resuming with {len(kept)} trained "
              f"models kept in {resume.folder}", file=sys.stderr)
    zoo = train_defender_zoo(features, {a: samples.attributes[a] for a in names},
                             {a: data.attribute_classes(job.data_dir)[a] for a in names},
                             size=spec["zoo_size"],
                             epochs=spec["zoo_epochs"], lr=spec["zoo_lr"], seed=spec["seed"],
                             kept=None if resume is None else
                             lambda name, train: resume.piece(name, train, dict, dict))
    save_zoo(paths.zoo_file(results, case, seed, round), zoo)
    if resume is not None:
        resume.finish()
    print(f"zoo {case} seed {seed} round {round}: {spec['zoo_size']} models x {names}",
          file=sys.stderr)


def _work(config: dict, results: Path, job: dict) -> dict[str, int]:
    """The per-sample gradients of D_train, then zoo_size x attributes x epochs x batches
    of one defender MLP's step."""
    spec = config["attribute"]
    steps = spec["zoo_size"] * len(zoo_attributes(config, job["case"])) * spec["zoo_epochs"] \
        * math.ceil(spec["train_samples"] / ZOO_BATCH)
    return {cost.model_unit(config, results, job["case"], "fl_step", 1): spec["train_samples"],
            f"mlp_step:{spec['feature_size']}:b{ZOO_BATCH}": steps}


def _time_step(parts: list[str], batch: int, device, gen):
    """One SGD step of a defender MLP on random features (``mlp_step:<features>``)."""
    import torch

    from gradleak.adversaries.neural import make_net

    net = make_net(int(parts[0]), [ZOO_WIDTH] * 3, 2, 0).to(device)
    x = torch.rand((batch, int(parts[0])), generator=gen).to(device)
    y = torch.randint(2, (batch,), generator=gen).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.0, momentum=0.9)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return step


def _files(job: Job) -> list[Path]:
    return [paths.zoo_file(job.results, job.case, job.seed, r)
            for r in job.config["attribute"]["rounds"]]


def _load(job: Job) -> adversaries.ModelZoo:
    round_ = job.config["attribute"]["rounds"][0] if job.zoo_round is None else job.zoo_round
    return adversaries.load_zoo(paths.zoo_file(job.results, job.case, job.seed, round_))


KINDS = {"model_zoo": Kind(lambda job, _of: _files(job), lambda job, _model, _of: _load(job))}

PHASE = Phase(
    name="train_zoo",
    summary="train RecUP-FL's model zoo for a case, seed and round",
    wildcards=("case", "seed", "round"),
    folders=("zoo",),
    reads=("prepare_data", "fl_run"),
    outputs=lambda config, results, jobs=None: {
        "zoo": Output(paths.zoo_file(results, "{case}", "{seed}", "{round}"))},
    run=train_zoo,
    inputs=lambda config, results, job: [
        paths.data_manifest(results, plan.find_case(config, job["case"])["dataset"]),
        paths.checkpoint(results, job["case"], plan.NONE, job["seed"], job["round"])],
    params=lambda config, results, job: {"attribute": clean_attribute_spec(config["attribute"]),
                                "attributes": zoo_attributes(config, job["case"])},
    gpu=always,
    work=_work,
    units={"mlp_step": _time_step},
    startup="startup:gradients",
    # as soon as its checkpoint is there: RecUP-FL's jobs, the longest, wait on it
    priority=lambda config, results, job: 2,
    kinds=KINDS,
    resumable=True,
)
