"""The studies' registry: each kind's measurement, the datasets and evaluation networks it
reads, where it runs (``register``), and what a study wrote (``load``)."""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradleak.experiment import paths
from gradleak.utils.io import load_npy, read_json


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


def load(results: Path, name: str) -> StudyResult:
    """What :func:`run` wrote for ``name``."""
    out = paths.study_dir(results, name)
    record = read_json(out / "metrics.json")
    return StudyResult(record["rows"], {k: load_npy(out / f"{k}.npy") for k in record["arrays"]})
