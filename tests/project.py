"""A fresh copy of the project (as a clone has it) and the commands run in it, for the
tests that run the pipeline, Snakemake or the CLI end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

PROJECT_FILES = ["Snakefile", "dvc.yaml", "params.yaml", ".dvcignore", "matplotlibrc",
                 "workflow", "config", "src"]
ENV = {**os.environ, "DVC_NO_ANALYTICS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def copy_project(dest: Path) -> Path:
    """A fresh copy of the project's files (as a clone has them), nothing else."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in PROJECT_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    return dest


def run(cmd: list[str], cwd: Path, check: bool = True, env: dict | None = None
        ) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env or ENV, capture_output=True, text=True)
    if check and proc.returncode != 0:  # a job's own error is in its log (tee'd to stdout)
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
                    f"\n-- its output's end:\n{proc.stdout[-3000:]}")
    return proc


def own_source(root: Path) -> dict:
    """The environment that runs a copied project's own package (its src/), as a clone
    installed with `pip install -e .` does: the jobs' code digests are of its files."""
    return {**ENV, "PYTHONPATH": str(root / "src")}
