"""The manual's commands (docs/cli.md), run as written in a fresh copy of the project."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import commands, doc_block
from project import ENV, copy_project


@pytest.mark.slow
def test_every_step_without_snakemake_runs_as_written(tmp_path):
    root = copy_project(tmp_path / "project")
    for command in commands(doc_block("docs/cli.md", "## Every step without Snakemake", "bash")):
        proc = subprocess.run(command, shell=True, cwd=root, env=ENV, capture_output=True,
                              text=True)
        assert proc.returncode == 0, f"{command}:\n{proc.stderr[-2000:]}"
    assert (root / "results/fl/digits-lenet-iid-k10/dp_gaussian-0.01/seed0/metrics.json").is_file()


@pytest.mark.slow
def test_python_api_example_runs_and_reconstructs(tmp_path):
    example = doc_block("docs/cli.md", "## Python API", "python")
    proc = subprocess.run([sys.executable, "-c", example],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    psnr, ssim = map(float, proc.stdout.split())
    assert psnr > 20 and ssim > 0.5
