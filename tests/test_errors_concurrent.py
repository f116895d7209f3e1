"""Two runs at once in one folder: while a run works, every second `snakemake` that would
lock the folder stops at once, names the live run (pid, start time) and suggests nothing
that would break it (--unlock, --rerun-incomplete, --cleanup-metadata); the live run
finishes untouched."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml
from test_pipeline import ENV, SNAKEMAKE, copy_project

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("live_run")]
# Only the FL runs (`all_fl_run`): their 1,500 rounds outlast the second runs, and the
# lock is the results folder's whatever a run targets.
# (the target first: `--configfile` takes every word after it as a file)
LIVE = ["all_fl_run", "--cores", "1", "--configfile", "config/live.yaml"]
DAMAGING = ("--unlock", "--rerun-incomplete", "--cleanup-metadata", "Traceback")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The FL runs of the tiny configuration made long, started in the background; the
    tests of this module try second runs while it works, the last one waits for it."""
    root = copy_project(tmp_path_factory.mktemp("live") / "project")
    config = yaml.safe_load((root / "config" / "test.yaml").read_text())
    config["fl"]["rounds"] = 1500
    config["defenses"] = {"none": {"strengths": [0]}, "dp_gaussian": {"strengths": [0.01]}}
    config["attribute"]["defenses"] = ["none"]
    (root / "config" / "live.yaml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen([*SNAKEMAKE, *LIVE], cwd=root, env=ENV, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    resolved = root / "results" / "config.resolved.json"
    deadline = time.monotonic() + 120
    while not (root / "results" / "logs" / "fl_run").is_dir():  # its first FL job runs
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.5)
    yield root, process, resolved.read_bytes()
    if process.poll() is None:
        process.kill()


@pytest.mark.parametrize("second", [
    [*SNAKEMAKE, *LIVE],
    [*SNAKEMAKE, *LIVE, "--config", "fl={'rounds': 5}"],
    [*SNAKEMAKE, "--cores", "all"],
    [*SNAKEMAKE, *LIVE, "--rerun-incomplete"],
    [*SNAKEMAKE, "--unlock", "--configfile", "config/live.yaml"],
    [*SNAKEMAKE, *LIVE, "--cleanup-metadata", "results/report.md"],
], ids=["same command", "other config", "embedded default", "rerun-incomplete", "unlock",
        "cleanup-metadata"])
def test_a_second_run_stops_at_once_and_names_the_live_one(live, second):
    root, process, resolved = live
    assert process.poll() is None, "the live run ended before this case ran"
    proc = subprocess.run(second, cwd=root, env=ENV, capture_output=True, text=True)
    assert process.poll() is None, "the live run ended while this case ran"
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"fedleak: another snakemake run (pid {process.pid}, started ")
    assert str(root) in lines[0] and not any(word in proc.stderr for word in DAMAGING)
    assert (root / "results" / "config.resolved.json").read_bytes() == resolved


def test_the_live_run_finishes_untouched(live):
    root, process, resolved = live
    output = process.communicate(timeout=900)[0]
    assert process.returncode == 0, output[-4000:]
    assert (root / "results" / "config.resolved.json").read_bytes() == resolved
    again = subprocess.run([*SNAKEMAKE, "-n", *LIVE], cwd=root, env=ENV, capture_output=True,
                           text=True)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
