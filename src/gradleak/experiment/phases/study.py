"""Phase ``study``: one study target's measurement, a paper's number that needs no FL or
attack run (``experiment.studies``: Refiner Figs. 3-6 and Table 5, RecUP-FL Table 1), its
rows (``metrics.json``) and images (``<name>.npy``) under results/studies/<target>/."""

from __future__ import annotations

import sys
from pathlib import Path

from gradleak.experiment import paths, plan
from gradleak.experiment.phase import Output, Phase
from gradleak.experiment.studies.kinds import STUDIES
from gradleak.experiment.studies.registry import Study
from gradleak.utils.io import save_npy, write_json


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


def _gpu(config: dict, results: Path, job: dict) -> bool | None:
    """By the study's kind (``registry.register(device=...)``): ``times`` (its seconds are
    the device's, as the papers time defenses on GPUs) asks for one, ``runs`` (a few images
    through a network) only under ``device: cuda``, None never runs on the device."""
    device = STUDIES[config["targets"][job["name"]]["study"]["kind"]].device
    return None if device is None else device == "times"


PHASE = Phase(
    name="study",
    summary="one study target's measurement (no FL or attack run)",
    wildcards=("name",),
    folders=("studies",),
    reads=("prepare_data", "train_evalnet"),
    outputs=lambda config, results, jobs=None: {
        "folder": Output(paths.study_dir(results, "{name}"), directory=True)},
    run=run,
    planned=lambda config: [{"name": name} for name in plan.studies(config)],
    inputs=lambda config, results, job: inputs(config, results, job["name"]),
    params=lambda config, results, job: plan.target_spec(config, job["name"]),
    tables=True,
    gpu=_gpu,
)
