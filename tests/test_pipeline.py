"""The Snakemake/DVC pipeline end to end on config/test.yaml (seconds per run)."""

from __future__ import annotations

import hashlib
import json
import os
import re
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


def run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def digests(root: Path) -> dict[str, str]:
    """sha256 of every table and figure, but the measured wall times (timing.csv)."""
    files = sorted([*root.glob("results/tables/*.csv"), *root.glob("results/figures/*")])
    files = [f for f in files if f.name != "timing.csv"]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


TEST_RUN = ["snakemake", "--cores", "all", "--configfile", "config/test.yaml"]  # as the README
GPU_RULES = {"train_evalnet", "train_gan", "attack"}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    """The tiny configuration run once, locally, in a fresh copy of the project."""
    root = copy_project(tmp_path_factory.mktemp("local"))
    run(TEST_RUN, root)
    return root


@pytest.mark.slow
def test_two_clean_runs_are_byte_identical_and_the_html_report_captions_every_figure(
        local_run, tmp_path):
    first, second = local_run, copy_project(tmp_path / "b")
    run(TEST_RUN, second)
    expected = {f"results/tables/{t}.csv" for t in
                ("utility", "privacy", "tradeoff", "censor_table", "evalnet_monotonicity")}
    expected |= {f"results/figures/{k}_{a}.png" for k in ("pmm_vs_psnr", "recon")
                 for a in ("dlg", "idlg", "inverting_gradients")}
    produced = digests(first)
    assert expected <= set(produced)
    assert produced == digests(second)
    assert (first / "results" / "report.md").read_text() == \
        (second / "results" / "report.md").read_text()
    assert (first / "results" / "gan" / "digits.png").is_file()
    assert (first / "results" / "tables" / "timing.csv").is_file()
    assert sorted(p.name for p in (first / "results" / "logs").iterdir()) == [
        "aggregate", "attack", "attribute", "fl_run", "prepare_data", "train_evalnet",
        "train_gan", "train_giml", "train_zoo"]

    run([*SNAKEMAKE, "--report", "report.html", "--configfile", "config/test.yaml"], second)
    html = (second / "report.html").read_text()
    entries = dict(re.findall(r'"(results/figures/[^"]+\.png)": \{.*?"caption": "([^"]*)"', html))
    figures = {str(p.relative_to(second)) for p in (second / "results" / "figures").glob("*.png")}
    assert figures and set(entries) == figures
    assert all(len(caption) > 40 for caption in entries.values())


@pytest.mark.slow
def test_slurm_profile_submits_every_job_with_its_resources(local_run, tmp_path):
    """The SLURM profile through snakemake-executor-plugin-slurm, with SLURM's commands
    replaced by tests/cluster/slurm_shim.py: every job goes through sbatch, GPU rules ask
    for a GPU on the gpu partition and the others do not, and the tables are the local
    run's, byte for byte."""
    root = copy_project(tmp_path / "project")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "srun", "sacct", "squeue", "sinfo", "scancel", "scontrol",
                 "sacctmgr", "sshare"):
        (bin_dir / name).symlink_to(REPO / "tests" / "cluster" / "slurm_shim.py")
    env = {**ENV, "PATH": f"{bin_dir}:{ENV['PATH']}", "SLURM_SHIM_DIR": str(tmp_path / "shim"),
           "SLURM_SHIM_ACCOUNT": "changeme"}
    proc = subprocess.run(
        [*SNAKEMAKE, "--profile", "workflow/profiles/slurm", "--configfile", "config/test.yaml",
         "--latency-wait", "5", "--seconds-between-status-checks", "1",
         "--slurm-init-seconds-before-status-checks", "1"],
        cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    calls = [json.loads(line) for line in (tmp_path / "shim" / "calls.jsonl").read_text()
             .splitlines()]
    comments = [c["args"][c["args"].index("--comment") + 1] for c in calls]
    rules = [c.removeprefix("rule_").split("_wildcards_")[0] for c in comments]
    local = (local_run / ".snakemake" / "log").glob("*.log")
    local_jobs = re.findall(r"^(?:local)?rule (\w+):", next(local).read_text(), flags=re.M)
    assert sorted(rules) == sorted(r for r in local_jobs if r != "all")
    for rule, call in zip(rules, calls):
        args = " ".join(call["args"])
        if rule in GPU_RULES:
            assert "-p gpu" in args and "--gpus=1" in args and "--cpus-per-gpu=4" in args
            assert "--mem 16000" in args
        else:
            assert "-p cpu" in args and "--gpus" not in args and "-t 120" in args
    assert digests(root) == digests(local_run)


@pytest.mark.slow
def test_dvc_repro_runs_every_stage_then_has_nothing_to_do(tmp_path):
    """params.yaml names the configuration `dvc repro` runs; the tests point it at the tiny
    one (the embedded default takes minutes)."""
    root = copy_project(tmp_path / "project")
    (root / "params.yaml").write_text("config: config/test.yaml\n")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
                [sys.executable, "-m", "dvc", "init", "-q"]):
        run(cmd, root)
    first = run([sys.executable, "-m", "dvc", "repro"], root)
    for stage in ("data", "evalnet", "gan", "fl", "attack", "aggregate"):
        assert f"Running stage '{stage}'" in first.stdout
    assert (root / "results" / "report.md").is_file()
    lock = (root / "dvc.lock").read_text()
    assert "config/test.yaml" in lock
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


def test_a_configfile_replaces_the_embedded_default(tmp_path):
    """--configfile is the whole experiment: nothing of config/config.yaml leaks into it."""
    root = copy_project(tmp_path / "project")
    proc = run([*SNAKEMAKE, "-n", "--configfile", "config/test.yaml"], root)
    resolved = json.loads((root / "results" / "config.resolved.json").read_text())
    assert sorted(resolved["defenses"]) == ["censor", "dp_gaussian", "none", "recupfl", "refiner"]
    assert resolved["fl"]["rounds"] == 4 and resolved["attack"]["victims_by_attack"] == {}
    assert "/pruning-" not in proc.stdout
    default = run([*SNAKEMAKE, "-n", "--config", "threads=2"], root)
    resolved = json.loads((root / "results" / "config.resolved.json").read_text())
    assert resolved["threads"] == 2 and "pruning" in resolved["defenses"]
    assert "/pruning-0.99/" in default.stdout
