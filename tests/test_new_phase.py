"""A new phase as a newcomer adds it (docs/architecture.md "Adding a phase"): one module in
``experiment/phases/`` and the regenerated dvc.yaml, nothing else edited, give its
Snakemake rule, its ``gradleak`` command, its DVC stage and its cluster resources."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys

import pytest
import yaml
from conftest import REPO
from project import PROJECT_FILES, SNAKEMAKE, copy_project, own_source, run

TOY = '''"""Phase ``pixel_means``: the mean pixel value of each class in a prepared dataset's
train split (a toy: what adding a phase takes)."""

from __future__ import annotations

from pathlib import Path

from gradleak import data
from gradleak.experiment import paths
from gradleak.experiment.phase import Output, Phase
from gradleak.utils.io import write_json


def _file(results: Path, dataset: str) -> Path:
    return Path(results) / "pixel_means" / f"{dataset}.json"


def pixel_means(config: dict, results: Path, dataset: str) -> None:
    train = data.load_prepared(paths.data_dir(results, dataset), "train")
    write_json(_file(results, dataset), {str(c): float(train.x[train.y == c].mean())
                                         for c in train.y.unique().tolist()})


PHASE = Phase(
    name="pixel_means",
    summary="the mean pixel value of each class of a dataset",
    wildcards=("dataset",),
    folders=("pixel_means",),
    reads=("prepare_data",),
    outputs=lambda config, results, jobs=None: {"means": Output(_file(results, "{dataset}"))},
    run=pixel_means,
    planned=lambda config: [{"dataset": name}
                            for name in sorted({case["dataset"] for case in config["cases"]})],
    inputs=lambda config, results, job: [paths.data_manifest(results, job["dataset"])],
)
'''


def changed_files(root) -> list[str]:
    """The project's files in ``root`` that differ from this checkout's, or are new."""
    found = []
    for name in PROJECT_FILES:
        ours = REPO / name
        for path in sorted((root / name).rglob("*")) if ours.is_dir() else [root / name]:
            if path.is_file() and "__pycache__" not in path.parts:
                mine = REPO / path.relative_to(root)
                if not mine.is_file() or not filecmp.cmp(path, mine, shallow=False):
                    found.append(str(path.relative_to(root)))
    return found


@pytest.mark.slow
def test_a_toy_phase_needs_its_module_and_the_regenerated_dvc_yaml(tmp_path):
    root = copy_project(tmp_path / "project")
    (root / "src" / "gradleak" / "experiment" / "phases" / "pixel_means.py").write_text(TOY)
    env = own_source(root)
    made = subprocess.run([sys.executable, "-m", "gradleak.cli", "dvc-yaml"], cwd=root, env=env,
                          capture_output=True, text=True, check=True)
    (root / "dvc.yaml").write_text(made.stdout)
    assert changed_files(root) == ["dvc.yaml", "src/gradleak/experiment/phases/pixel_means.py"]

    stage = yaml.safe_load(made.stdout)["stages"]["pixel_means"]
    assert "src/gradleak/experiment/phases/pixel_means.py" in stage["deps"]
    listed = subprocess.run([sys.executable, "-m", "gradleak.cli", "pixel-means", "--help"],
                            cwd=root, env=env, capture_output=True, text=True)
    assert listed.returncode == 0 and "--dataset" in listed.stdout

    run([*SNAKEMAKE, "all_pixel_means", "--cores", "1", "--configfile", "config/test.yaml"],
        root, env=env)
    means = json.loads((root / "results" / "pixel_means" / "digits.json").read_text())
    assert sorted(means, key=int) == [str(c) for c in range(10)]
    assert all(0 < m < 1 for m in means.values())
