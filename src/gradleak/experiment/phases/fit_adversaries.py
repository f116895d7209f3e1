"""Phase ``fit_adversaries``: RecUP-FL's attribute adversaries that have a saved form (the
neural ones, most of the fitting time; §5.4), fitted once on clean gradient features of
D_train under the round's model of one setting and shared by every attribute job that
learns under that model (``plan.adversary_setting``: at round 0, all)."""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from gradleak import adversaries, data
from gradleak.experiment import cost, paths, plan
from gradleak.experiment.attribute_samples import (
    ADVERSARIES_FORMAT,
    clean_attribute_spec,
    model_digest,
    started,
    train_features,
)
from gradleak.experiment.job import model_at
from gradleak.experiment.phase import Output, Phase, always
from gradleak.settings import Setting
from gradleak.utils.io import save_torch


def fit_adversaries(config: dict, results: Path, case: str, setting: Setting, seed: int,
                    round: int) -> None:
    """The savable adversaries of every attribute, fitted on clean features of D_train
    under the round-``round`` model of ``setting``, with that model's digest."""
    planned = plan.adversary_jobs(config)
    if (case, setting, round) not in planned:
        raise ValueError(f"no attribute job learns under the round-{round} model of setting "
                         f"{setting.text!r} of case {case!r}; expected one of "
                         f"{[(c, s.text, r) for c, s, r in planned]}")
    job, spec, names, own, device, samples = started(config, results, case, setting, seed)
    model = model_at(job, data.load_prepared(job.data_dir, "train"),
                     paths.checkpoint(results, case, setting, seed, round)).to(device)
    train_x, train_labels = train_features(model, samples, spec)
    savable = [n for n in spec["adversaries"] if adversaries.build(n).savable]
    fitted = {}
    for attribute in tqdm(names, desc="adversaries", unit="attribute", leave=False):
        fitted[attribute] = {
            name: adversaries.build(name, seed=own["adversary"]).to(device)
            .fit(train_x, train_labels[attribute]).state() for name in savable}
    save_torch(paths.adversaries_file(results, case, setting, seed, round),
               {"format": ADVERSARIES_FORMAT, "model": model_digest(model), "fitted": fitted})
    print(f"adversaries {savable} of {case} {setting} seed {seed} round {round}: fitted on "
          f"{len(train_x)} clean gradients x {names}", file=sys.stderr)


def _params(config: dict, results: Path, job: dict) -> dict:
    """What fitting the adversaries reads from the configuration."""
    resolved = plan.resolve(config, job["setting"])
    return {"attribute": clean_attribute_spec(resolved["attribute"]),
            "case": plan.find_case(config, job["case"])}


def _work(config: dict, results: Path, job: dict) -> dict[str, int]:
    """The per-sample gradients of the train and test samples (the fitting is not counted)."""
    spec = config["attribute"]
    return {cost.model_unit(config, results, job["case"], "fl_step", 1):
            spec["train_samples"] + spec["test_samples"]}


PHASE = Phase(
    name="fit_adversaries",
    summary="fit the attribute adversaries once under one setting's model at a round",
    wildcards=("case", "setting", "seed", "round"),
    folders=("adversaries",),
    reads=("prepare_data", "fl_run"),
    outputs=lambda config, results, jobs=None: {"adversaries": Output(paths.adversaries_file(
        results, "{case}", "{setting}", "{seed}", "{round}"))},
    run=fit_adversaries,
    inputs=lambda config, results, job: [
        paths.data_manifest(results, plan.find_case(config, job["case"])["dataset"]),
        paths.checkpoint(results, job["case"], job["setting"], job["seed"], job["round"])],
    params=_params,
    gpu=always,
    work=_work,
    startup="startup:gradients",
)
