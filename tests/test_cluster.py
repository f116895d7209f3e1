"""Cluster resources from the environment and the budgets, and `fedleak verify`'s errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

from fedleak import config as fedleak_config
from fedleak.experiment import cluster


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("ACCOUNT", "PARTITION", "GPU_PARTITION", "GPUS", "GPU_MODEL", "RATE"):
        monkeypatch.delenv(f"FEDLEAK_SLURM_{name}", raising=False)


def test_gpu_rules_ask_for_a_gpu_and_cpu_rules_do_not(monkeypatch):
    monkeypatch.setenv("FEDLEAK_SLURM_ACCOUNT", "lab42")
    monkeypatch.setenv("FEDLEAK_SLURM_GPU_MODEL", "a100")
    attack, fl = cluster.resources("attack", 30), cluster.resources("fl_run", 12)
    assert attack == {"mem_mb": 16000, "runtime": 30, "slurm_partition": "gpu", "gpu": 1,
                      "cpus_per_gpu": 4, "gpu_model": "a100", "slurm_account": "lab42"}
    assert fl == {"mem_mb": 2000, "runtime": 12, "slurm_partition": "cpu",
                  "slurm_account": "lab42"}


def test_zero_gpus_runs_gpu_rules_on_cpus_in_the_gpu_partition(monkeypatch):
    monkeypatch.setenv("FEDLEAK_SLURM_GPUS", "0")
    monkeypatch.setenv("FEDLEAK_SLURM_GPU_PARTITION", "short")
    out = cluster.resources("train_gan")
    assert "gpu" not in out and out["slurm_partition"] == "short"
    assert out["mem_mb"] == cluster.DEFAULT_MEMORY_MB


@pytest.mark.parametrize("name, value, expected", [
    ("FEDLEAK_SLURM_GPUS", "two", "expected a number"),
    ("FEDLEAK_SLURM_GPUS", "1.5", "expected a whole number"),
    ("FEDLEAK_SLURM_GPUS", "-1", "expected a number >= 0"),
    ("FEDLEAK_SLURM_RATE", "0", "expected a rate > 0"),
    ("FEDLEAK_SLURM_RATE", "inf", "expected a number >= 0"),
])
def test_a_bad_variable_is_named_with_its_value(monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    with pytest.raises(cluster.ClusterError, match=f"{name}=.*{expected}"):
        cluster.resources("prepare_data")


def test_attack_wall_time_grows_with_the_budget_and_falls_with_the_rate(monkeypatch):
    paper = fedleak_config.load(REPO / "config" / "paper" / "epafl.yaml")
    test = fedleak_config.load(REPO / "config" / "test.yaml")
    labels = tuple(paper["attacks"])
    slow = cluster.attack_minutes(paper, labels)
    assert slow > cluster.attack_minutes(test, tuple(test["attacks"]))
    monkeypatch.setenv("FEDLEAK_SLURM_RATE", "50")
    fast = cluster.attack_minutes(paper, labels)
    assert cluster.STARTUP_MINUTES < fast < slow
    assert slow - cluster.STARTUP_MINUTES == pytest.approx(
        10 * (fast - cluster.STARTUP_MINUTES), abs=10)


def test_verify_without_a_lock_names_the_file(tmp_path):
    run = subprocess.run([sys.executable, "-m", "fedleak.cli", "verify", "--root", str(tmp_path)],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert f"{tmp_path}/dvc.lock: no dvc.lock" in run.stderr
