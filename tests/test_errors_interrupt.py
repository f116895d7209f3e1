"""Interrupted runs (docs/errors.md, "Interrupted runs"): SIGKILL of Snakemake (with its
running jobs) or of one job at any moment, and a disk that fills up while a file is
written. Nothing half-written is left under results/; the README's plain command, run
again, removes the lock a killed run left, re-makes what was unfinished and gives
byte-identical tables to an uninterrupted run."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import torch
from project import ENV, copy_project

from gradleak.utils import io
from gradleak.utils.runlock import OWNER, release_stale_lock

# The tiny configuration cut to what the interruption needs (data, FL, attack, aggregate
# rules; two settings, so that jobs run side by side when they are killed).
CONFIG = """title: interrupted
threads: 1
datasets:
  digits: {channels: 1}
cases:
  - {dataset: digits, model: lenet, partition: {kind: iid, clients: 4}}
fl: {seeds: [0], rounds: 4, client_batch_size: 8, eval_every: 2}
defenses:
  none: {strengths: [0]}
  dp_gaussian: {strengths: [0.01]}
attack: {victims: {count: 2}, attacker: {seeds: [0]},
         outputs: {grid_victims: 1, metrics: [psnr, ssim, mse]}}
attacks:
  dlg: {iterations: 2}
  # long enough that an attack job is seen running (its start-up alone takes about 2 s)
  inverting_gradients: {iterations: 400, tv: 0.1}
"""
RUN = ["snakemake", "--cores", "all", "--configfile", "config/interrupt.yaml"]  # the README's
CASE = "digits-lenet-iid-k4"
SETTINGS = ("none-0", "dp_gaussian-0.01")


def project(root: Path) -> Path:
    root = copy_project(root)
    (root / "config" / "interrupt.yaml").write_text(CONFIG)
    return root


def table_digests(root: Path) -> dict[str, str]:
    """sha256 of every table but the measured wall times."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "results" / "tables").glob("*.csv")) if p.name != "timing.csv"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, str]:
    root = project(tmp_path_factory.mktemp("uninterrupted"))
    proc = subprocess.run(RUN, cwd=root, env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    digests = table_digests(root)
    assert {"utility.csv", "privacy.csv", "tradeoff.csv"} <= set(digests)
    return digests


class Moment:
    """A job of ``rule`` is running: its log was (re)written since the run started, its
    output is not there yet, and ``partial`` (a glob, or a test of the project's folder)
    holds or it has run for ``patience`` seconds."""

    def __init__(self, rule: str, outputs: list[tuple[str, str, str]], patience: float = 3.0):
        self.rule, self.outputs, self.patience = rule, outputs, patience
        self.seen: dict[str, float] = {}

    def running(self, root: Path, since: float) -> str | None:
        for log, output, partial in self.outputs:
            log_path, done = root / log, root / output
            if not log_path.is_file() or log_path.stat().st_mtime < since or done.exists():
                continue
            first = self.seen.setdefault(log, time.time())
            reached = partial(root) if callable(partial) else list(root.glob(partial))
            if reached or time.time() - first > self.patience:
                return log
        return None


FL = Moment("fl_run", [(f"results/logs/fl_run/{CASE}/{s}/seed0.log",
                        f"results/fl/{CASE}/{s}/seed0/metrics.json",
                        f"results/fl/{CASE}/{s}/seed0/round0.pt") for s in SETTINGS])
ATTACK = Moment("attack", [(f"results/logs/attack/{CASE}/{s}/seed0.log",
                            f"results/attacks/{CASE}/{s}/seed0/metrics.json",
                            f"results/attacks/{CASE}/{s}/seed0/details/*.png") for s in SETTINGS])
AGGREGATE = Moment("aggregate", [("results/logs/aggregate/aggregate.log", "results/report.md",
                                  "results/tables/*.csv")])


def run_and_kill(root: Path, moment: Moment, whole: bool, command: list[str] = RUN) -> str:
    """Start the plain ``command``; at ``moment`` SIGKILL Snakemake with its running jobs
    (``whole``) or only the job's own process. Returns Snakemake's output."""
    start = time.time() - 1  # file times are coarser than time.time()
    moment.seen.clear()
    proc = subprocess.Popen(command, cwd=root, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killed = None
    try:
        while killed is None and time.time() - start < 500:
            if proc.poll() is not None:
                pytest.fail(f"the run ended ({proc.returncode}) before a {moment.rule} job "
                            f"could be killed:\n{proc.stdout.read()[-3000:]}")
            if moment.running(root, start):
                if whole:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = "snakemake"
                else:
                    for job in psutil.Process(proc.pid).children(recursive=True):
                        try:
                            line = job.cmdline()
                            if "gradleak" in " ".join(line[:2]) and \
                                    moment.rule.replace("_", "-") in line:
                                job.send_signal(signal.SIGKILL)
                                killed = "job"
                                break
                        except psutil.Error:  # ended meanwhile
                            continue
            time.sleep(0.05)
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed, f"no {moment.rule} job to kill"
    assert proc.returncode != 0, output[-3000:]
    return output


def assert_nothing_half_written(root: Path) -> None:
    """Every result file that exists is whole: it loads."""
    for path in sorted((root / "results").rglob("*")):
        if not path.is_file() or path.name.startswith(".") or \
                path.relative_to(root / "results").parts[0] in ("logs", "benchmarks"):
            continue
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".pt":
            io.load_torch(path)
        elif path.suffix == ".npy":
            np.load(path, allow_pickle=False)
        elif path.suffix == ".csv":
            pd.read_csv(path)
        elif path.suffix == ".png":
            from PIL import Image

            with Image.open(path) as image:
                image.load()


@pytest.mark.slow
def test_sigkill_at_three_moments_then_the_plain_command_gives_identical_tables(
        uninterrupted, tmp_path):
    root = project(tmp_path / "project")
    outputs = []
    for moment, whole in ((FL, True), (ATTACK, False), (ATTACK, True), (AGGREGATE, True)):
        outputs.append(run_and_kill(root, moment, whole))
        assert_nothing_half_written(root)
    # a killed Snakemake leaves its lock: the next plain run removed it and went on
    assert "removed the lock that a killed run" in outputs[1]  # after the FL kill
    assert "Error in rule attack" in outputs[1]  # its killed job, reported by Snakemake
    assert "removed the lock" not in outputs[2]  # Snakemake itself ended that run
    assert "removed the lock that a killed run" in outputs[3]  # after the attack kill
    final = subprocess.run(RUN, cwd=root, env=ENV, capture_output=True, text=True)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "removed the lock that a killed run" in final.stderr  # after the aggregate kill
    assert table_digests(root) == uninterrupted
    assert_nothing_half_written(root)
    host = socket.gethostname()
    assert not [p for p in (root / "results").rglob(f".*.{host}-*")], "temporary files left"
    assert not (root / ".snakemake" / "locks").exists()
    again = subprocess.run([*RUN, "-n"], cwd=root, env=ENV, capture_output=True, text=True)
    assert "Nothing to be done" in again.stdout + again.stderr


# -- a full disk ------------------------------------------------------------------------


def full_disk(monkeypatch, module, name: str, error: Exception) -> None:
    """``module.name`` writes half of its output, then fails as a full disk does."""

    def failing(*args, **kwargs):
        target = next(a for a in [*args, *kwargs.values()] if isinstance(a, (str, Path))
                      or hasattr(a, "write"))
        if hasattr(target, "write"):
            target.write(b"\x93NUMPY half")
        else:
            Path(target).write_bytes(b"half")
        raise error

    monkeypatch.setattr(module, name, failing)


def figure(path: Path) -> None:
    import matplotlib.pyplot as plt

    from gradleak.report.figures import save_figure

    fig = plt.figure()
    save_figure(fig, path)


@pytest.mark.parametrize("patch, write, name", [
    ((torch, "save", RuntimeError("[enforce fail at inline_container.cc:672] . unexpected "
                                  "pos 704 vs 598")),
     lambda p: io.save_torch(p, {"w": torch.zeros(3)}), "round0.pt"),
    ((np, "save", OSError(errno.ENOSPC, "No space left on device")),
     lambda p: io.save_npy(p, np.zeros(3)), "train_x.npy"),
    ((Path, "write_text", OSError(errno.ENOSPC, "No space left on device")),
     lambda p: io.write_json(p, {"a": 1}), "metrics.json"),
    ((pd.DataFrame, "to_csv", OSError(errno.ENOSPC, "No space left on device")),
     lambda p: __import__("gradleak.report.tables", fromlist=["write_csv"]).write_csv(
         pd.DataFrame({"a": [1]}), p), "utility.csv"),
    (("matplotlib.figure.Figure", "savefig", OSError(errno.ENOSPC, "No space left on device")),
     figure, "tradeoff_psnr.png"),
], ids=["torch", "npy", "json", "csv", "figure"])
def test_a_full_disk_leaves_the_old_file_or_none_and_names_the_path(tmp_path, monkeypatch,
                                                                   patch, write, name):
    module, attribute, error = patch
    if isinstance(module, str):
        path, cls = module.rsplit(".", 1)
        module = getattr(__import__(path, fromlist=[cls]), cls)
    target = tmp_path / "results" / name
    target.parent.mkdir(parents=True)
    target.write_bytes(b"the complete previous version")
    full_disk(monkeypatch, module, attribute, error)
    with pytest.raises(OSError) as raised:
        write(target)
    message = str(raised.value)
    assert f"cannot write {target}" in message and "nothing was written" in message
    assert target.read_bytes() == b"the complete previous version"
    assert sorted(p.name for p in target.parent.iterdir()) == [name]  # no temporary file


@pytest.mark.slow
def test_the_cli_reports_a_full_disk_in_one_line_and_leaves_no_partial_file(tmp_path):
    """A real write failure: the file-size limit of the process stands in for a full disk."""
    import resource

    config = tmp_path / "c.yaml"
    config.write_text("cases: [{dataset: digits, model: lenet}]\n")

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    proc = subprocess.run([sys.executable, "-m", "gradleak.cli", "prepare-data", "--config",
                           str(config), "--dataset", "digits", "--results",
                           str(tmp_path / "results")], env=ENV, capture_output=True,
                          text=True, preexec_fn=limit)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write" in lines[0] and "train_x.npy" in lines[0]
    folder = tmp_path / "results" / "data" / "digits"
    assert sorted(p.name for p in folder.iterdir()) == []  # nothing half-written
    assert not (folder / "manifest.json").exists()


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path):
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".metrics.json.{host}-{dead.pid}-abcd1234.json"
    stale.write_text('{"half": ')
    live = tmp_path / f".metrics.json.{host}-{os.getppid()}-efgh5678.json"
    live.write_text('{"being written": ')
    io.write_json(tmp_path / "metrics.json", {"whole": True})
    assert not stale.exists() and live.exists()
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"whole": True}


# -- the lock a killed run leaves --------------------------------------------------------


def locked(root: Path, owner: dict | None) -> Path:
    locks = root / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text("results/report.md\n")
    if owner is not None:
        (locks / OWNER).write_text(json.dumps(owner))
    return locks


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("owner, removed, says", [
    (lambda: {"host": socket.gethostname(), "pid": dead_pid()}, True, "removed the lock"),
    (lambda: {"host": socket.gethostname(), "pid": os.getppid()}, False, None),
    (lambda: {"host": "another-node", "pid": dead_pid()}, False, None),
    (lambda: None, False, "snakemake --unlock"),
], ids=["killed_run", "live_run", "other_host", "unknown_owner"])
def test_only_the_lock_of_a_dead_run_is_removed(tmp_path, owner, removed, says):
    locks = locked(tmp_path, owner())
    message = release_stale_lock(tmp_path, take=False)
    assert (not locks.exists()) == removed
    assert (says is None and message is None) or says in message


def test_removing_a_stale_lock_remakes_the_killed_jobs_outputs(tmp_path):
    import base64

    locked(tmp_path, {"host": socket.gethostname(), "pid": dead_pid()})
    unfinished = tmp_path / "results" / "fl" / "round0.pt"
    unfinished.parent.mkdir(parents=True)
    unfinished.write_bytes(b"whole, but its job was killed")
    finished = tmp_path / "results" / "data.json"
    finished.write_text("{}")
    marks = tmp_path / ".snakemake" / "incomplete"
    marks.mkdir(parents=True)
    (marks / base64.urlsafe_b64encode(b"results/fl/round0.pt").decode()).write_text("{}")
    message = release_stale_lock(tmp_path, take=True)
    assert "1 unfinished outputs are made again" in message
    assert not unfinished.exists() and finished.exists() and not list(marks.iterdir())
    owner = json.loads((tmp_path / ".snakemake" / "locks" / OWNER).read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()


# -- a killed long job resumes ----------------------------------------------------------

# One FL run of 60 rounds (its state kept every 5th), one attack job of five one-chunk attacks
RESUMED = """title: resumed
threads: 1
datasets: {digits: {channels: 1, size: 16}}
cases: [{dataset: digits, model: lenet, partition: {kind: iid, clients: 4}}]
fl: {seeds: [0], rounds: 60, client_batch_size: 8, eval_every: 5}
defenses: {none: {strengths: [0]}}
attack: {victims: {count: 3}, protocol: {round: 45}, outputs: {grid_victims: 1, metrics: [psnr]}}
attacks:
""" + "".join(f"  ig{i}: {{attack: inverting_gradients, iterations: 150, tv: 0.0{i + 1}}}\n"
              for i in range(5))
RESUME_RUN = ["snakemake", "--cores", "all", "--configfile", "config/resumed.yaml"]
JOB = f"{CASE}/none-0/seed0"


def kept_state_past(round_: int):
    """Whether the FL job's kept state is of round ``round_`` or later."""
    def reached(root: Path) -> bool:
        for path in root.glob(f"results/partial/fl_run/{JOB}/*/state.pt"):
            try:
                return io.load_torch(path)["state"]["round"] >= round_
            except (OSError, ValueError, KeyError):  # replaced as it was read
                break
        return False
    return reached


def resumed_project(root: Path) -> Path:
    root = copy_project(root)
    (root / "config" / "resumed.yaml").write_text(RESUMED)
    return root


@pytest.mark.slow
def test_a_killed_fl_run_and_attack_job_resume_from_what_they_kept(tmp_path):
    """The FL job killed after round 45's state was kept, then the attack job after its fourth
    of five chunks: each rerun continues from the kept state (its log says so) and the
    tables are those of an uninterrupted run."""
    clean = resumed_project(tmp_path / "clean")
    assert subprocess.run(RESUME_RUN, cwd=clean, env=ENV, capture_output=True).returncode == 0
    root = resumed_project(tmp_path / "killed")
    fl = Moment("fl_run", [(f"results/logs/fl_run/{JOB}.log", f"results/fl/{JOB}/metrics.json",
                            kept_state_past(45))], patience=600)
    attack = Moment("attack", [(f"results/logs/attack/{JOB}.log",
                                f"results/attacks/{JOB}/metrics.json",
                                f"results/partial/attack/{JOB}/*/ig3.paper.0.pt")],
                    patience=600)
    run_and_kill(root, fl, whole=False, command=RESUME_RUN)
    assert not (root / f"results/fl/{JOB}/metrics.json").exists()
    run_and_kill(root, attack, whole=False, command=RESUME_RUN)
    fl_log = (root / f"results/logs/fl_run/{JOB}.log").read_text()
    # from the last state kept before the kill landed (45, or 50 if it ran on a moment)
    resumed = re.search(r"resuming at round (\d+) of 60 from", fl_log)
    assert resumed and 45 <= int(resumed[1]) < 60, fl_log[-2000:]
    final = subprocess.run(RESUME_RUN, cwd=root, env=ENV, capture_output=True, text=True)
    assert final.returncode == 0, final.stderr[-3000:]
    attack_log = (root / f"results/logs/attack/{JOB}.log").read_text()
    assert "resuming with 4 finished chunks of victims kept in" in attack_log, attack_log[-2000:]
    assert table_digests(root) == table_digests(clean)
    assert not (root / "results" / "partial").exists()
