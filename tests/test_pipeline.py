"""The Snakemake/DVC pipeline end to end on config/test.yaml (seconds per run)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from conftest import commands, doc_block
from project import ENV, SNAKEMAKE, copy_project, own_source, run

from gradleak.experiment import configuration, pipeline


def digests(root: Path) -> dict[str, str]:
    """sha256 of every table and figure, but the measured wall times (timing.csv)."""
    files = sorted([*root.glob("results/tables/*.csv"), *root.glob("results/figures/*")])
    files = [f for f in files if f.name != "timing.csv"]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


TEST_RUN = ["snakemake", "--cores", "all", "--configfile", "config/test.yaml"]  # as the README
# the GPU partition's jobs of config/test.yaml (device auto, a LeNet case: cluster.py)
GPU_RULES = {"train_evalnet", "train_gan", "train_giml", "attack", "train_zoo",
             "fit_adversaries"}


@pytest.fixture(scope="session")
def live_local_run(tmp_path_factory, live_slurm_run) -> tuple[Path, subprocess.Popen, bytes]:
    """The README's command on the tiny configuration, started in the background in a fresh
    copy of the project running its own source, once its lock is held (the tests that use
    it share one xdist worker, so it runs once; the SLURM runs start first): its root, its
    process and the resolved configuration it wrote."""
    root = copy_project(tmp_path_factory.mktemp("local"))
    process = subprocess.Popen(TEST_RUN, cwd=root, env=own_source(root), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (root / "results" / "logs").is_dir():  # its first job runs
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.5)
    yield root, process, (root / "results" / "config.resolved.json").read_bytes()
    if process.poll() is None:
        process.kill()


@pytest.fixture(scope="session")
def local_run(live_local_run) -> Path:
    """That run, finished: the second runs tried while it worked changed nothing of it."""
    root, process, resolved = live_local_run
    output = process.communicate(timeout=900)[0]
    assert process.returncode == 0, output[-4000:]
    assert (root / "results" / "config.resolved.json").read_bytes() == resolved
    return root


# While a run works, every second `snakemake` that would lock the folder stops at once,
# names the live run (pid, start time) and suggests nothing that would break it; the live
# run finishes untouched (docs/errors.md, "Two runs at once"). These run before the tests
# that wait for the run to finish (xdist keeps a group's tests in file order).
DAMAGING = ("--unlock", "--rerun-incomplete", "--cleanup-metadata", "Traceback")


@pytest.mark.slow
@pytest.mark.xdist_group("local_run")
@pytest.mark.parametrize("second", [
    TEST_RUN,
    [*TEST_RUN, "--config", "fl={'rounds': 5}"],
    ["snakemake", "--cores", "all"],
    [*TEST_RUN, "--rerun-incomplete"],
    ["snakemake", "--unlock", "--configfile", "config/test.yaml"],
    [*TEST_RUN, "--cleanup-metadata", "results/report.md"],
], ids=["same command", "other config", "embedded default", "rerun-incomplete", "unlock",
        "cleanup-metadata"])
def test_a_second_run_stops_at_once_and_names_the_live_one(live_local_run, second):
    root, process, resolved = live_local_run
    assert process.poll() is None, "the live run ended before this case ran"
    proc = subprocess.run(second, cwd=root, env=own_source(root), capture_output=True,
                          text=True)
    assert process.poll() is None, "the live run ended while this case ran"
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"gradleak: another snakemake run (pid {process.pid}, started ")
    assert str(root) in lines[0] and not any(word in proc.stderr for word in DAMAGING)
    assert (root / "results" / "config.resolved.json").read_bytes() == resolved


@pytest.fixture(scope="session")
def dvc_run(tmp_path_factory) -> tuple[Path, str]:
    """The tiny configuration through `dvc repro` (params.yaml names the configuration it
    runs; the embedded default takes minutes) in a fresh git repository of the project: the
    second clean run beside ``local_run``. Its root and the first repro's output."""
    root = copy_project(tmp_path_factory.mktemp("dvc") / "project")
    (root / "params.yaml").write_text("config: config/test.yaml\n")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
                [sys.executable, "-m", "dvc", "init", "-q"]):
        run(cmd, root)
    return root, run([sys.executable, "-m", "dvc", "repro"], root).stdout


def job_stats(output: str) -> Counter:
    """Jobs per rule in the table Snakemake prints before it runs them."""
    stats = output[output.index("Job stats"):]
    return Counter({rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", stats, re.M)
                    if rule not in ("all", "total") and not rule.startswith("all_")})


def planned(root: Path, env: dict) -> Counter:
    """Jobs per rule that `snakemake -n` plans for config/test.yaml (nothing: empty)."""
    dry = run([*SNAKEMAKE, "-n", "--configfile", "config/test.yaml"], root, env=env).stdout
    return job_stats(dry) if "Job stats" in dry else Counter()


@pytest.mark.slow
@pytest.mark.xdist_group("local_run")
def test_an_edit_re_plans_only_the_jobs_that_run_the_edited_code(local_run):
    """A job's code is its phase's import closure (experiment/code.py): an edit of
    a figure module re-plans the aggregation alone, one of an attack no FL run, one of the
    estimate or of the schema's text nothing (a restored file re-plans nothing either)."""
    env = own_source(local_run)

    def after(edit: str, old: str = "", new: str = "\n# an edit\n") -> Counter:
        path = local_run / "src" / "gradleak" / edit
        text = path.read_text()
        assert old in text
        try:
            path.write_text(text.replace(old, new, 1) if old else text + new)
            return planned(local_run, env)
        finally:
            path.write_text(text)

    assert planned(local_run, env) == Counter()
    assert after("report/figures.py") == Counter({"aggregate": 1})
    attack = after("attacks/dlg.py")
    assert "fl_run" not in attack and attack["attack"] == 5 and attack["aggregate"] == 1
    assert after("experiment/estimate.py") == Counter()
    assert after("schemas/attack.schema.yaml", "fewer victims for costly attacks",
                 "fewer victims for the costly attacks") == Counter()
    assert planned(local_run, env) == Counter()


@pytest.mark.slow
@pytest.mark.xdist_group("local_run")
def test_two_clean_runs_are_byte_identical_and_the_html_report_captions_every_figure(
        local_run, dvc_run):
    """The README's snakemake command and `dvc repro` (its stages' snakemake calls), each in
    a fresh copy: the same tables, figures and report, byte for byte."""
    first, second = local_run, dvc_run[0]
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
    initial = [torch.load(f, weights_only=True)
               for f in sorted((first / "results" / "fl").glob("*/*/seed0/round0.pt"))]
    assert len(initial) >= 4  # none, RecUP-FL and Refiner among them: every setting starts alike
    assert all(torch.equal(w[k], initial[0][k]) for w in initial for k in w)
    walked = pipeline.walk(configuration.load(first / "config" / "test.yaml"), first / "results")
    assert sorted(p.name for p in (first / "results" / "logs").iterdir()) == sorted(
        [name for name, jobs in walked.items() if jobs] + ["warm.log"])  # a folder per phase
    served = (first / "results" / "logs" / "warm.log").read_text()
    assert "ready" in served and "cold start" not in served  # every job after it was forked

    run([*SNAKEMAKE, "--report", "report.html", "--configfile", "config/test.yaml"], second)
    html = (second / "report.html").read_text()
    entries = dict(re.findall(r'"(results/figures/[^"]+\.png)": \{.*?"caption": "([^"]*)"', html))
    figures = {str(p.relative_to(second)) for p in (second / "results" / "figures").glob("*.png")}
    assert figures and set(entries) == figures
    assert all(len(caption) > 40 for caption in entries.values())


@functools.cache
def slurm_unavailable() -> str | None:
    """Why no SLURM controller can take jobs here, or None: asked when a slurm test starts,
    not while tests are collected (`sinfo` waits about 9 s for a controller that is down)."""
    if shutil.which("sbatch") is None:
        return "SLURM is not installed (tests/cluster/slurm-local.sh install, as root)"
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if proc.returncode != 0 or not {"idle", "mixed", "allocated"} & set(proc.stdout.split()):
        return "no SLURM node answers (tests/cluster/slurm-local.sh start, as root)"
    return None


def slurm_job(jobid: str) -> dict[str, str]:
    """`scontrol show job` as a dict (slurm-local.sh keeps finished jobs for an hour)."""
    text = subprocess.run(["scontrol", "show", "job", jobid], capture_output=True,
                          text=True, check=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def cancel_first_running(rule: str, process: subprocess.Popen) -> str | None:
    """Wait until a job of ``rule`` runs on SLURM, cancel it and return its id."""
    while process.poll() is None:
        queue = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"],
                               capture_output=True, text=True).stdout
        for line in queue.splitlines():
            jobid, comment = line.split(maxsplit=1)
            if comment.startswith(f"rule_{rule}_"):
                subprocess.run(["scancel", jobid], check=True)
                return jobid
        time.sleep(0.5)
    return None


def slurm_arrays(output: str) -> list[tuple[list[str], str]]:
    """The arrays an array-profile run submitted: (Snakemake job ids, SLURM job id) each."""
    return [(ids.split(","), slurm_id) for ids, slurm_id in re.findall(
        r"Submitted array job with Snakemake IDs ([\d,]+) and SLURM job ID (\d+)", output)]


def rules_of_jobs(output: str) -> dict[str, str]:
    """Snakemake job id -> rule, from the job blocks it prints (rule name, then jobid)."""
    return dict((jobid, rule) for rule, jobid in re.findall(
        r"^rule (\w+):\n(?:    .*\n)*?    jobid: (\d+)", output, flags=re.M))


def assert_resources(rule: str, slurm_id: str, payload_mb: int = 0) -> None:
    """The partition, memory and wall time cluster.py gives ``rule``'s jobs (an array's
    memory with the plugin's allowance for the array's payload, at least 1 MB)."""
    job = slurm_job(slurm_id)
    assert job["Partition"] == ("gpu" if rule in GPU_RULES else "cpu"), (rule, job)
    memory = 2000 if rule in ("fl_run", "prepare_data") else 4000
    assert job["MinMemoryNode"] == f"{memory + payload_mb}M", (rule, job)
    if rule not in ("attack", "fl_run"):
        assert job["TimeLimit"] == "02:00:00", (rule, job)


@pytest.fixture(scope="session")
def live_slurm_run(tmp_path_factory):
    """The slurm test's two runs (below), started in the background in a fresh copy of the
    project as the local run starts, so that their waits for SLURM's status overlap it;
    None without SLURM. Its root, its thread and what the thread saw."""
    if slurm_unavailable():
        yield None
        return
    root = copy_project(tmp_path_factory.mktemp("slurm"))
    script = "\n".join(commands(doc_block("docs/cluster.md", "## Try it on one machine",
                                          "bash", 2)))
    seen: dict = {}

    def both_runs() -> None:
        arrays = subprocess.Popen([*SNAKEMAKE, "all_fl_run", "--profile",
                                   "workflow/profiles/slurm-array", "--configfile",
                                   "config/test.yaml", "--seconds-between-status-checks", "2",
                                   "--slurm-init-seconds-before-status-checks", "2"],
                                  cwd=root, env={**ENV, "GRADLEAK_SLURM_GPUS": "0"},  # no GPU
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen["process"] = arrays
        seen["first"] = arrays.communicate()[0]
        if arrays.returncode != 0:
            return
        process = subprocess.Popen(["bash", "-e", "-c", script], cwd=root, env=ENV,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen["process"] = process
        seen["cancelled"] = cancel_first_running("attack", process)
        seen["output"] = process.communicate()[0]

    thread = threading.Thread(target=both_runs, daemon=True)
    thread.start()
    yield root, thread, seen
    if thread.is_alive() and seen.get("process") and seen["process"].poll() is None:
        seen["process"].terminate()  # Snakemake cancels its SLURM jobs


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.xdist_group("local_run")
def test_slurm_runs_every_job_in_arrays_or_alone_and_resubmits_a_cancelled_one(
        local_run, live_slurm_run):
    """Both SLURM profiles on a real single-node SLURM (tests/cluster/slurm-local.sh):
    workflow/profiles/slurm-array makes the FL runs (`all_fl_run`; those ready together go
    to SLURM as one array, each job once), then the manual's cluster block
    (docs/cluster.md) as written, makes the rest through workflow/profiles/slurm, one
    sbatch per job with its rule's partition, memory and wall time; an attack job
    cancelled with scancel mid-run is submitted again (the profile's retries). Together
    they run the local run's jobs, and the tables and figures are the local run's, byte
    for byte."""
    if why := slurm_unavailable():
        pytest.skip(f"slurm test not run: {why}")
    root, thread, seen = live_slurm_run
    thread.join(timeout=1800)
    first, output = seen["first"], seen.get("output", "")
    assert seen["process"].returncode == 0, (output or first)[-4000:]  # both runs, done
    in_arrays, rule_of = slurm_arrays(first), rules_of_jobs(first)
    alone = re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", first)
    made_first = job_stats(first)
    assert made_first["fl_run"] == 5 and max(len(ids) for ids, _ in in_arrays) > 1, first[-3000:]
    submitted_first = [j for ids, _ in in_arrays for j in ids] + [j for j, _ in alone]
    assert Counter(rule_of[j] for j in submitted_first) == made_first  # each job once
    for ids, slurm_id in in_arrays:  # an array: one rule's jobs, with that rule's resources
        assert len({rule_of[j] for j in ids}) == 1
        assert_resources(rule_of[ids[0]], slurm_id, payload_mb=1)
    for jobid, slurm_id in alone:
        assert_resources(rule_of[jobid], slurm_id)

    cancelled = seen["cancelled"]
    assert cancelled is not None, "no attack job was seen running"
    rule_of = rules_of_jobs(output)
    submitted = re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", output)
    local = [log.read_text() for log in (local_run / ".snakemake" / "log").glob("*.log")]
    done = [log for log in local if "steps (100%) done" in log]  # not the refused second runs
    assert len(done) == 1, len(local)
    local_jobs = Counter(re.findall(r"^(?:local)?rule (\w+):", done[0], flags=re.M))
    del local_jobs["all"]
    assert made_first + Counter(rule_of[j] for j in {j for j, _ in submitted}) == local_jobs
    again = [j for j, s in submitted if s == cancelled]
    assert again and [s for j, s in submitted if j == again[0]][-1] != cancelled
    assert slurm_job(cancelled)["JobState"] == "CANCELLED"
    for jobid, slurm_id in submitted:
        assert_resources(rule_of[jobid], slurm_id)
    assert digests(root) == digests(local_run)


@pytest.mark.slow
@pytest.mark.xdist_group("local_run")
def test_dvc_repro_runs_every_stage_then_has_nothing_to_do(dvc_run):
    root, first = dvc_run
    for stage in yaml.safe_load((root / "dvc.yaml").read_text())["stages"]:
        assert f"Running stage '{stage}'" in first
    assert (root / "results" / "report.md").is_file()
    lock = (root / "dvc.lock").read_text()
    assert "config/test.yaml" in lock
    second = run([sys.executable, "-m", "dvc", "repro"], root)
    assert "Running stage" not in second.stdout
    assert "up to date" in second.stdout
    assert (root / "dvc.lock").read_text() == lock

    # The reviewers' path, as the manual writes it (docs/dvc.md): push to a remote, pull in a fresh
    # clone, nothing to reproduce, every file verified; a tampered table is named.
    env = {**ENV, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    script = "\n".join(commands(doc_block("docs/dvc.md", "## Reproduce as a reviewer", "bash")))
    review = subprocess.run(["bash", "-e", "-c", script], cwd=root, env=env,
                            capture_output=True, text=True)
    assert review.returncode == 0, review.stdout[-2000:] + review.stderr[-2000:]
    assert "Data and pipelines are up to date." in review.stdout
    outputs = sum(len(stage.get("outs", [])) for stage in
                  yaml.safe_load((root / "dvc.lock").read_text())["stages"].values())
    assert f"verified: {outputs} outputs" in review.stdout  # every stage's folder
    clone = root.parent / "review"
    assert (clone / "results" / "report.md").read_bytes() == \
        (root / "results" / "report.md").read_bytes()
    with (clone / "results" / "tables" / "utility.csv").open("a") as table:
        table.write("0,0\n")
    tampered = run(["gradleak", "verify"], clone, check=False)
    assert tampered.returncode != 0
    assert "modified: results/tables/utility.csv" in tampered.stderr


@pytest.mark.slow
def test_a_configfile_replaces_the_embedded_default(tmp_path):
    """--configfile is the whole experiment: nothing of config/config.yaml leaks into it."""
    root = copy_project(tmp_path / "project")
    proc = run([*SNAKEMAKE, "-n", "--configfile", "config/test.yaml"], root)
    resolved = json.loads((root / "results" / "config.resolved.json").read_text())
    assert sorted(resolved["defenses"]) == ["censor", "dp_gaussian", "none", "recupfl", "refiner"]
    assert resolved["fl"]["rounds"] == 4 and resolved["attack"]["victims"]["by_attack"] == {}
    assert "/pruning-" not in proc.stdout
    priorities = {}  # (rule, setting) -> priority, from the dry run's job blocks
    for block in proc.stdout.split("rule ")[1:]:
        setting = re.search(r"setting=([^,\s]+)", block)
        priority = re.search(r"^\s*priority: (\d+)$", block, re.MULTILINE)
        priorities[(block.split(":")[0], setting and setting.group(1))] = \
            int(priority.group(1)) if priority else 0
    assert priorities[("train_zoo", None)] == 2  # RecUP-FL's jobs, the longest, wait on it
    for rule in ("fl_run", "attack", "attribute"):
        ranks = {s: p for (r, s), p in priorities.items() if r == rule}
        assert {p for s, p in ranks.items() if s.startswith("recupfl-")} == {1}, rule
        assert {p for s, p in ranks.items() if s.startswith(("none-", "dp_gaussian-"))} == {0}
    default = run([*SNAKEMAKE, "-n", "--config", "threads=2"], root)
    resolved = json.loads((root / "results" / "config.resolved.json").read_text())
    assert resolved["threads"] == 2 and "pruning" in resolved["defenses"]
    assert "/pruning-0.99/" in default.stdout
