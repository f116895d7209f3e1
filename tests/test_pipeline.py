"""The Snakemake/DVC pipeline end to end on config/test.yaml (seconds per run)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

PROJECT_FILES = ["Snakefile", "dvc.yaml", ".dvcignore", "matplotlibrc", "workflow", "config",
                 "src"]
ENV = {**os.environ, "DVC_NO_ANALYTICS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def copy_project(dest: Path, config: str = "test.yaml") -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in PROJECT_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    shutil.copy2(REPO / "config" / config, dest / "config" / "config.yaml")
    return dest


def run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def digests(root: Path) -> dict[str, str]:
    files = sorted([*root.glob("results/tables/*.csv"), *root.glob("results/figures/*")])
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.mark.slow
def test_two_clean_runs_are_byte_identical(tmp_path):
    first, second = copy_project(tmp_path / "a"), copy_project(tmp_path / "b")
    for root in (first, second):
        run([*SNAKEMAKE, "--cores", "2"], root)
    expected = {f"results/tables/{t}.csv" for t in
                ("utility", "privacy", "tradeoff", "evalnet_monotonicity")}
    expected |= {f"results/figures/{k}_{a}.png" for k in ("pmm_vs_psnr", "recon")
                 for a in ("dlg", "idlg", "inverting_gradients")}
    produced = digests(first)
    assert expected <= set(produced)
    assert produced == digests(second)
    assert (first / "results" / "report.md").read_text() == \
        (second / "results" / "report.md").read_text()
    assert (first / "results" / "gan" / "digits.png").is_file()


@pytest.mark.slow
def test_dvc_repro_runs_every_stage_then_has_nothing_to_do(tmp_path):
    root = copy_project(tmp_path / "project")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
                [sys.executable, "-m", "dvc", "init", "-q"]):
        run(cmd, root)
    first = run([sys.executable, "-m", "dvc", "repro"], root)
    for stage in ("data", "evalnet", "gan", "fl", "attack", "aggregate"):
        assert f"Running stage '{stage}'" in first.stdout
    assert (root / "results" / "report.md").is_file()
    lock = (root / "dvc.lock").read_text()
    second = run([sys.executable, "-m", "dvc", "repro"], root)
    assert "Running stage" not in second.stdout
    assert "up to date" in second.stdout
    assert (root / "dvc.lock").read_text() == lock


@pytest.mark.parametrize("override, key", [
    (["fll=1"], "unknown key 'fll'"),
    (["fl={'rounds': 'x'}"], "'fl.rounds'"),
    (["defenses={'dp_gausian': {'strengths': [0.1]}}"], "unknown key 'defenses.dp_gausian'"),
    (["attacks={'dgl': {}}"], "unknown key 'attacks.dgl'"),
    (["defenses={'pruning': {'strengths': [-0.5]}}"], "'defenses.pruning.strengths[0]'"),
])
def test_bad_config_fails_before_any_job_with_one_line(tmp_path, override, key):
    root = copy_project(tmp_path / "project")
    proc = run([*SNAKEMAKE, "--cores", "1", "--config", *override], root, check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if key in line]
    assert len(lines) == 1, proc.stderr
    assert "fedleak: invalid config" in lines[0]
    assert not (root / "results").exists()


def test_slurm_profile_dry_run_puts_gpus_only_on_gpu_rules(tmp_path):
    root = copy_project(tmp_path / "project")
    proc = run([*SNAKEMAKE, "--dry-run", "--profile", "workflow/profiles/slurm"], root)
    assert "attack" in proc.stdout and "fl_run" in proc.stdout
    slurm = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    assert slurm["executor"] == "slurm"
    assert "gpu" not in slurm["default-resources"]
    assert {r for r, res in slurm["set-resources"].items() if res.get("gpu")} == \
        {"train_evalnet", "train_gan", "attack"}
    default = (REPO / "workflow/profiles/default/config.yaml").read_text()
    assert "gpu" not in default
