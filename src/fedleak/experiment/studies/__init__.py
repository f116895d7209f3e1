"""Studies: a paper's measurements that need no FL or attack run (Refiner Fig. 3's
perturbations, ...). A target with ``study: {kind: ..., <parameters>}`` in place of
``select`` is one; ``rule study`` -> ``fedleak study --name <t>`` -> :func:`run` writes its
rows (``metrics.json``) and its images (``<name>.npy``) under ``results/studies/<t>/``,
which ``rule target`` turns into the target's table and figure like any other rows.

A study is one module here: a function ``(config, results, params) -> StudyResult``
registered under its kind with :func:`register`, its parameters, ``columns`` and
``metrics`` in the schema (``definitions.studies.<kind>``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedleak.experiment import paths, plan
from fedleak.utils.io import load_npy, read_json, save_npy, write_json


@dataclass
class StudyResult:
    rows: list[dict]                        # one per measured point: columns, then metrics
    arrays: dict[str, np.ndarray] = field(default_factory=dict)   # images for its figure


@dataclass(frozen=True)
class Study:
    run: Callable[[dict, Path, dict], StudyResult]
    datasets: Callable[[dict], list[str]]   # the prepared datasets it reads, from its params
    # the datasets whose evaluation network (rule train_evalnet) it loads, from its params
    evalnets: Callable[[dict], list[str]] = lambda params: []
    # where it runs: None on the CPU (no model on a device), "runs" on the configuration's
    # device (utils.device.select), "times" on it and its numbers are that device's seconds;
    # cluster.gpu_job asks SLURM for a GPU from it
    device: str | None = None


STUDIES: dict[str, Study] = {}


def _named_datasets(params: dict) -> list[str]:
    """The ``dataset`` and ``datasets`` parameters of a study."""
    named = [params["dataset"]] if "dataset" in params else []
    return named + list(params.get("datasets", []))


def register(kind: str, datasets: Callable[[dict], list[str]] = _named_datasets,
             evalnets: Callable[[dict], list[str]] = lambda params: [],
             device: str | None = None):
    if device not in (None, "runs", "times"):
        raise ValueError(f"study {kind!r}: device must be None, 'runs' or 'times', got "
                         f"{device!r}")

    def wrap(function: Callable[[dict, Path, dict], StudyResult]):
        STUDIES[kind] = Study(function, datasets, evalnets, device)
        return function
    return wrap


def _study(config: dict, name: str) -> tuple[Study, dict]:
    if name not in plan.studies(config):
        raise ValueError(f"target {name!r} is not a study; expected one of "
                         f"{plan.studies(config)}")
    params = config["targets"][name]["study"]
    return STUDIES[params["kind"]], params


def inputs(config: dict, results: Path, name: str) -> list[Path]:
    """The files a study reads (its datasets' manifests, the evaluation networks it loads)."""
    study, params = _study(config, name)
    return [*(paths.data_manifest(results, d) for d in study.datasets(params)),
            *(paths.evalnet_file(results, d) for d in study.evalnets(params))]


def run(config: dict, results: Path, name: str) -> None:
    """Measure one study target; its rows and images under ``results/studies/<name>/``."""
    study, params = _study(config, name)
    result = study.run(config, Path(results), params)
    out = paths.study_dir(results, name)
    for key, array in sorted(result.arrays.items()):
        save_npy(out / f"{key}.npy", array)
    write_json(out / "metrics.json", {"target": name, "study": params, "rows": result.rows,
                                      "arrays": sorted(result.arrays)})
    print(f"{name}: {len(result.rows)} rows, {out}", file=sys.stderr)


def load(results: Path, name: str) -> StudyResult:
    """What :func:`run` wrote for ``name``."""
    out = paths.study_dir(results, name)
    record = read_json(out / "metrics.json")
    return StudyResult(record["rows"], {k: load_npy(out / f"{k}.npy") for k in record["arrays"]})


from fedleak.experiment.studies import defense_cost, perturbation  # noqa: E402,F401,I001
from fedleak.experiment.studies import evalnet_blend, refiner_init  # noqa: E402,F401,I001
