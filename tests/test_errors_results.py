"""The results folder itself: a file, a broken link or a folder in the wrong place, or a
folder this user cannot write stops `snakemake` before any job with one line naming the
path and what to do, and leaves what is there as it was; `gradleak clean` finds the kept
pieces no planned job reads."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from conftest import REPO
from project import ENV, SNAKEMAKE, copy_project

from gradleak import cli
from gradleak import config as cfg
from gradleak.experiment import configuration, kept, paths, phases, pipeline

DRY = [*SNAKEMAKE, "-n", "--configfile", "config/test.yaml"]


def make_file(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("a user's notes\n")


def make_link(target):
    def make(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    return make


PLACES = [
    ("results", make_file, "results is a file, not a folder"),
    ("results", make_link("/nonexistent/results"),
     "results is a broken link to /nonexistent/results, not a folder"),
    ("results", make_link("config/test.yaml"), "results is a link to a file, not a folder"),
    ("results/fl", make_file, "results/fl is a file, not a folder: the run writes its fl"),
    ("results/logs", make_file, "results/logs is a file, not a folder: the run writes its logs"),
    ("results/config.resolved.json", lambda p: p.mkdir(parents=True),
     "results/config.resolved.json is a folder, not the resolved configuration file"),
]
PLACE_IDS = ["file", "broken link", "link to a file", "fl is a file", "logs is a file",
             "config is a folder"]


def results_paths(root):
    return sorted((p.relative_to(root), p.is_symlink()) for p in root.rglob("results*"))


@pytest.mark.parametrize("where, make, says", PLACES, ids=PLACE_IDS)
def test_a_results_path_that_is_not_a_usable_folder_is_named(tmp_path, monkeypatch, where,
                                                              make, says):
    """What the Snakefile checks before any job (``paths.results_problem``)."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "test.yaml").write_text("title: t\n")
    make(tmp_path / where)
    before = results_paths(tmp_path)
    monkeypatch.chdir(tmp_path)
    problem = paths.results_problem("results")
    assert problem.startswith(says) and "move it away" in problem, problem
    assert results_paths(tmp_path) == before


@pytest.mark.slow
@pytest.mark.parametrize("where, make, says", [PLACES[0], PLACES[3]], ids=[
    PLACE_IDS[0], PLACE_IDS[3]])
def test_a_results_path_that_is_not_a_usable_folder_stops_the_run_in_one_line(
        tmp_path, where, make, says):
    root = copy_project(tmp_path / "project")
    make(root / where)
    before = results_paths(root)
    proc = subprocess.run(DRY, cwd=root, env=ENV, capture_output=True, text=True)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"gradleak: {says}") and "move it away" in lines[0]
    assert results_paths(root) == before  # nothing written or removed
    assert (root / where).read_text() == "a user's notes\n"


def test_a_results_folder_this_user_cannot_write_is_named_with_its_owner_and_mode(
        tmp_path, monkeypatch):
    """Checked with os.access, as the user's own permissions decide (root writes anywhere,
    so the test answers for a user without write permission)."""
    results = tmp_path / "results"
    results.mkdir(mode=0o555)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    problem = paths.results_problem(results)
    assert problem.startswith(f"cannot write in {results} (owner ")
    assert "mode dr-xr-xr-x" in problem and "chmod u+w" in problem
    monkeypatch.undo()
    writable = os.access(results, os.W_OK | os.X_OK)  # root's: yes, whatever the mode
    assert (paths.results_problem(results) is None) == writable


@pytest.mark.parametrize("inside", ["fl", "fl/digits-lenet-iid-k10/none-0/seed0", "logs/attack"])
def test_a_folder_inside_results_this_user_cannot_write_is_named(tmp_path, monkeypatch,
                                                                  inside):
    """A job writes deep inside results/: a read-only folder there stops the run before any
    job, named with its owner and mode, as results itself would be."""
    results = tmp_path / "results"
    (results / inside).mkdir(parents=True)
    (results / "fl" / "other").mkdir(parents=True, exist_ok=True)
    real = os.access
    monkeypatch.setattr(os, "access",
                        lambda path, mode: str(path) != str(results / inside) and real(path, mode))
    problem = paths.results_problem(results)
    assert problem is not None and problem.startswith(f"cannot write in {results / inside} ")
    assert "(owner " in problem and "chmod u+w" in problem
    monkeypatch.undo()
    assert paths.results_problem(results) is None  # writable: nothing to say


def test_clean_lists_and_removes_the_kept_pieces_no_planned_job_reads(tmp_path, capsys,
                                                                       monkeypatch):
    """Kept pieces of two configurations (the test one, and one with FL rounds 6): `gradleak
    clean` on the first lists the other's folders with their sizes and removes nothing;
    with --remove they go and the first's stay."""
    monkeypatch.chdir(REPO)
    results = tmp_path / "results"
    first = configuration.load(REPO / "config" / "test.yaml")
    other = tmp_path / "rounds6.yaml"
    raw = cfg.read(REPO / "config" / "test.yaml")
    other.write_text(yaml.safe_dump({**raw, "fl": {**raw["fl"], "rounds": 6}}))
    fl = phases.load("fl_run")

    def pieces(config):
        folders = [kept.folder(fl, config, results, identity)
                   for identity in pipeline.walk(config, results)["fl_run"]]
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "state.pt").write_bytes(b"\0" * 2000)
        return folders

    mine, theirs = pieces(first), pieces(configuration.load(other))
    assert not set(mine) & set(theirs)
    assert cli.main(["clean", "--config", "config/test.yaml", "--results", str(results)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in listed[:-1]] == sorted(map(str, theirs))
    assert all(line.split()[:2] == ["2.0", "kB"] for line in listed[:-1])
    assert listed[-1].startswith(f"{len(theirs)} folder(s), {2.0 * len(theirs):.1f} kB")
    assert all(f.is_dir() for f in theirs)
    assert cli.main(["clean", "--config", "config/test.yaml", "--results", str(results),
                     "--remove"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"removed {len(theirs)}")
    assert all(f.is_dir() for f in mine) and not any(f.exists() for f in theirs)
