"""A job's ``threads`` hold every native pool it uses: torch's and the BLAS and OpenMP pools of
NumPy, SciPy and scikit-learn, those loaded after the job set them too
(``gradleak.utils.threads``; docs/measurements.md m104)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import yaml
from threadpoolctl import threadpool_info

from gradleak import cli
from gradleak.utils.threads import POOL_VARIABLES, threads_within, use_threads

# torch and OpenBLAS take at most one thread a core: on a machine of two cores or more, two
# pools' default and the one thread of a job (and of a test worker) differ
TWO = 2


def pool_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info()}


def test_pools_that_load_after_the_limit_take_it_too():
    """A fresh interpreter (its pools would take every core) sets one thread, then loads
    SciPy, scikit-learn and torch, as a job loads them after its start."""
    code = ("from gradleak.utils.threads import use_threads; use_threads(1); "
            "import scipy.linalg, sklearn.linear_model, torch; "
            "from threadpoolctl import threadpool_info; "
            "print(sorted({p['num_threads'] for p in threadpool_info()}), "
            "torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k not in POOL_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["[1]", "1"]


def test_a_phase_command_runs_with_the_configured_threads(tmp_path):
    """`gradleak prepare-data` (SciPy and scikit-learn's data, no model: Snakemake counts one
    thread for it whatever the configuration's ``threads``) in a process whose pools take
    two threads leaves every pool at one."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "threads": TWO, "datasets": {"digits": {"channels": 1, "size": 8}},
        "cases": [{"dataset": "digits", "model": "lenet"}]}))
    use_threads(TWO)
    assert cli.main(["prepare-data", "--config", str(config), "--results",
                     str(tmp_path / "results"), "--dataset", "digits"]) == 0
    assert pool_threads() == {1} and torch.get_num_threads() == 1


def test_threads_within_a_block_are_restored_after_it():
    use_threads(TWO)
    with threads_within(1):
        assert pool_threads() == {1} and torch.get_num_threads() == 1
    assert pool_threads() == {TWO} and torch.get_num_threads() == TWO
    with threads_within(None):
        assert pool_threads() == {TWO}
