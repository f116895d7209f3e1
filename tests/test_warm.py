"""Warm starts (gradleak.warm): a phase's command forked from a run's server writes what a
cold process writes and exits as it would, a killed command's child dies with it, and a
command the server cannot stand in for (another environment) runs cold, saying why."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from project import ENV, copy_project

from gradleak import warm

GRADLEAK = [sys.executable, "-m", "gradleak.cli"]
PREPARE = [*GRADLEAK, "prepare-data", "--config", "config/test.yaml", "--dataset", "digits"]
# the jobs of torch a fork could change (threads, generators): training, a noised FL run
# and an attack job
SMALL = """
threads: 2
datasets: {digits: {channels: 1, size: 16}, natural: {channels: 1, count: 200, seed: 0}}
cases: [{dataset: digits, model: lenet, partition: {kind: iid, clients: 4}}]
fl: {seeds: [0], rounds: 3, client_batch_size: 8, eval_every: 3}
defenses: {none: {strengths: [0]}, dp_gaussian: {strengths: [0.01]}}
attack: {victims: {count: 2}, outputs: {grid_victims: 2}}
attacks: {idlg: {iterations: 5}, inverting_gradients: {iterations: 8}}
evalnet: {epochs: 1, batch_size: 64, lr: 0.001, widths: [8, 16, 32]}
"""
JOBS = [["prepare-data", "--dataset", "digits"], ["prepare-data", "--dataset", "natural"],
        ["train-evalnet", "--dataset", "digits"],
        ["fl-run", "--case", "digits-lenet-iid-k4", "--setting", "dp_gaussian-0.01", "--seed", "0"],
        # the round-0 attack loads the undefended run's initial model (experiment.fl_runs)
        ["fl-run", "--case", "digits-lenet-iid-k4", "--setting", "none-0", "--seed", "0"],
        ["attack", "--case", "digits-lenet-iid-k4", "--setting", "dp_gaussian-0.01",
         "--seed", "0"]]


def wait_for(condition, what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.05)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A copy of the project with a warm server started in it as Snakemake's onstart does
    (this test's process standing in for Snakemake): its root and the jobs' environment."""
    root = copy_project(tmp_path / "project")
    monkeypatch.chdir(root)
    for name, value in {**ENV, "PYTHONPATH": str(root / "src")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # pytest changes it between setup and call
    warm.start(root / "results", warm.MIN_JOBS)
    path = os.environ[warm.SOCKET]
    wait_for(lambda: os.path.exists(path), "warm server socket")
    yield root, {**os.environ, **dict.fromkeys(warm.ONE_THREAD, "1")}
    warm.stop()
    wait_for(lambda: not os.path.exists(path), "server exit")


def log(root: Path) -> str:
    return (root / "results" / "logs" / "warm.log").read_text()


def unclocked(data: object) -> object:
    """A metrics JSON without its measured seconds (``wall_time``)."""
    if isinstance(data, dict):
        return {k: unclocked(v) for k, v in data.items() if k != "wall_time"}
    return [unclocked(v) for v in data] if isinstance(data, list) else data


def files(results: Path) -> dict[str, object]:
    """Every file a run wrote but its logs, a JSON file read without its seconds."""
    return {str(p.relative_to(results)): unclocked(json.loads(p.read_text()))
            if p.suffix == ".json" else p.read_bytes() for p in sorted(results.rglob("*"))
            if p.is_file() and p.relative_to(results).parts[0] != "logs"}


@pytest.mark.slow
def test_served_jobs_write_the_bytes_of_cold_ones_and_exit_as_they_do(served):
    """Data, the evaluation network, a noised FL run and an attack job, each forked and
    each cold, in turn."""
    root, env = served
    (root / "small.yaml").write_text(SMALL)
    cold = {**env, warm.SWITCH: "0"}
    for which, environment in (("warm", env), ("cold", cold)):
        for job in JOBS:
            subprocess.run([*GRADLEAK, *job, "--config", "small.yaml", "--results", which],
                           cwd=root, env=environment, check=True, capture_output=True)
    assert files(root / "warm") == files(root / "cold")
    assert {"data", "fl", "attacks"} <= {p.name for p in (root / "warm").iterdir()}
    assert log(root).count("cold start") == 0 and log(root).count("ran ") == len(JOBS)
    for environment in (env, cold):  # a bad identity: one line and status 2, either way
        proc = subprocess.run([*PREPARE[:-1], "nowhere"], cwd=root, env=environment,
                              capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("gradleak prepare-data: error:")
    assert log(root).count("cold start") == 0


@pytest.mark.slow
def test_a_command_in_another_environment_runs_cold_and_the_log_says_why(served):
    root, env = served
    proc = subprocess.run([*PREPARE, "--results", "other"], cwd=root,
                          env={**env, "GRADLEAK_SOMETHING": "else"}, capture_output=True)
    assert proc.returncode == 0 and (root / "other" / "data" / "digits").is_dir()
    assert "cold start: prepare-data: environment differs from the server's in " \
           "GRADLEAK_SOMETHING" in log(root)


SLOW_JOB = """
import os, sys, time
from gradleak import warm

def run(argv):
    with open(argv[0], "a") as out:
        for _ in range(600):
            out.write("."); out.flush(); time.sleep(0.05)
    return 0

warm.Server(sys.argv[1], int(sys.argv[2]), run, dict(os.environ)).serve()
"""


def test_a_killed_command_kills_its_child_and_the_server_leaves_with_its_run(tmp_path):
    """The child writes a dot every 50 ms for 30 s: once its command is SIGKILLed, no dot is
    written; once the process that started the server is gone, the server exits. A probe
    that asks nothing (``sweep``'s) leaves it serving."""
    (tmp_path / "warm").mkdir()
    path, ticks = str(tmp_path / "warm" / "socket"), tmp_path / "ticks"
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    server = subprocess.Popen([sys.executable, "-c", SLOW_JOB, path, str(parent.pid)],
                              cwd=tmp_path)
    wait_for(lambda: os.path.exists(path), "server socket")
    with socket.socket(socket.AF_UNIX) as probe:  # another run's sweep: the server goes on
        probe.connect(path)
    command = subprocess.Popen([sys.executable, "-c", "import sys; from gradleak import warm; "
                                "sys.exit(warm.handoff([sys.argv[1]]))", str(ticks)],
                               cwd=tmp_path, env={**os.environ, warm.SOCKET: path})
    wait_for(lambda: ticks.exists() and ticks.stat().st_size > 3, "dots")
    command.send_signal(signal.SIGKILL)
    command.wait()
    time.sleep(0.5)
    written = ticks.stat().st_size
    time.sleep(0.5)
    assert ticks.stat().st_size == written < 30
    parent.kill()
    parent.wait()
    assert server.wait(timeout=10) == 0 and not (tmp_path / "warm").exists()


def test_without_a_server_a_command_runs_itself(monkeypatch, tmp_path):
    monkeypatch.setenv(warm.SOCKET, str(tmp_path / "no-socket"))
    assert warm.handoff(["prepare-data"]) is None
    monkeypatch.setenv(warm.SWITCH, "0")
    assert warm.handoff(["prepare-data"]) is None


def test_a_new_run_removes_what_killed_servers_left_and_nothing_else(tmp_path):
    """A SIGKILLed run leaves its server's folder: with a socket nothing listens on, or
    empty where it was killed as it imported. Live servers and young folders stay."""
    def folder(name: str, listening: bool | None) -> tuple[Path, socket.socket | None]:
        path = tmp_path / f"{warm.PREFIX}{name}"
        path.mkdir()
        if listening is None:
            return path, None
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path / "socket"))
        server.listen(1)
        if not listening:
            server.close()
        return path, server

    dead, _ = folder("dead", listening=False)
    live, server = folder("live", listening=True)
    young, _ = folder("young", listening=None)
    old, _ = folder("old", listening=None)
    os.utime(old, (time.time() - 2 * warm.STALE_S,) * 2)
    other = tmp_path / "other"
    other.mkdir()
    warm.sweep(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, young.name, "other"])
    assert (live / "socket").exists()
    server.close()
