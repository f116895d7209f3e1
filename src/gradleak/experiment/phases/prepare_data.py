"""Phase ``prepare_data``: one dataset's splits (``data.prepare``) under results/data/, and
the check that the attack jobs can draw their victims from them. Declares the
``public_data`` artifact, the prepared public split."""

from __future__ import annotations

import sys
from pathlib import Path

from gradleak import data
from gradleak.data.victims import problem
from gradleak.experiment import paths, plan
from gradleak.experiment.phase import Kind, Output, Phase


def loader_options(config: dict, dataset: str) -> tuple[dict, dict, int]:
    """The loader options, split fractions and split seed of a configured dataset."""
    spec = dict(config["datasets"][dataset])
    splits = spec.pop("splits")
    seed = spec.pop("split_seed", spec.get("seed"))
    return spec, splits, seed


def prepare_data(config: dict, results: Path, dataset: str) -> None:
    if dataset not in config["datasets"]:
        raise ValueError(f"dataset {dataset!r} is not configured; expected one of "
                         f"{sorted(config['datasets'])}")
    options, splits, seed = loader_options(config, dataset)
    out = paths.data_dir(results, dataset)
    manifest = data.prepare(dataset, out, options, splits, seed)
    counts = {k: v["count"] for k, v in manifest["splits"].items()}
    print(f"prepared {dataset}: {counts} -> {out}", file=sys.stderr)
    # the victims the attack jobs draw from these splits (CENSOR's stride, a class), before
    # any FL run: the same check runs when snakemake starts with the data prepared
    if found := victim_problems(config, results, dataset):
        raise ValueError(found[0])


def missing(config: dict, results: Path, datasets: list[str]) -> list[str]:
    """Why each of ``datasets`` that is not prepared yet cannot be loaded (empty: all can)."""
    return [reason for name in datasets if not paths.data_manifest(results, name).is_file()
            and (reason := data.datasets.missing(name, config["datasets"][name]))]


def class_counts(results: Path, dataset: str) -> dict[str, list[int]] | None:
    """Split -> images per class of a prepared dataset (None: not prepared yet)."""
    if not paths.data_manifest(results, dataset).is_file():
        return None
    manifest = data.read_manifest(paths.data_dir(results, dataset))
    return {split: entry["class_counts"] for split, entry in manifest["splits"].items()}


def victim_problems(config: dict, results: Path, dataset: str | None = None) -> list[str]:
    """Why planned attack jobs (of ``dataset``'s cases, or all) cannot draw their victims
    from the prepared data (``data.victims``: CENSOR's stride, a victim class), one message
    per distinct reason (empty: all can, or no data is prepared yet)."""
    found: dict[str, str] = {}
    counts: dict[str, dict | None] = {}
    for case, setting in plan.attack_jobs(config):
        name = plan.find_case(config, case)["dataset"]
        if dataset not in (None, name):
            continue
        if name not in counts:
            counts[name] = class_counts(results, name)
        if counts[name] is None:
            continue
        why = problem(plan.resolve(config, setting)["attack"], counts[name], name)
        if why:
            found.setdefault(why, f"setting {setting.text!r} of case {case!r}: {why}")
    return list(found.values())


def _public(job) -> data.ImageData:
    return data.load_prepared(job.data_dir, "public")


KINDS = {"public_data": Kind(lambda job, _of: [paths.data_manifest(job.results, job.dataset)],
                             lambda job, _model, _of: (_public(job).x, _public(job).y))}

PHASE = Phase(
    name="prepare_data",
    summary="prepare one dataset's splits",
    wildcards=("dataset",),
    folders=("data",),
    reads=(),
    outputs=lambda config, results, jobs=None: {
        "manifest": Output(paths.data_manifest(results, "{dataset}"))},
    run=prepare_data,
    params=lambda config, results, job: config["datasets"][job["dataset"]],
    memory_mb=2000,
    kinds=KINDS,
)
