"""Phases as units: every pipeline phase is one module whose declaration the rules, the
plan, DVC, SLURM and the estimate read; a job depends on the code it runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from gradleak import config as cfg
from gradleak.experiment import code, configuration, dvc, phases, pipeline
from gradleak.experiment.phase import typed

CONFIGS = [REPO / "config" / "config.yaml", REPO / "config" / "test.yaml",
           *sorted((REPO / "config" / "paper").glob("*.yaml"))]
PHASES_DIR = REPO / "src" / "gradleak" / "experiment" / "phases"


def test_each_module_under_phases_is_a_phase_named_after_it():
    modules = sorted(p.stem for p in PHASES_DIR.glob("*.py") if p.stem != "__init__")
    assert list(phases.NAMES) == modules
    assert all(phases.load(name).name == name for name in modules)
    order = [p.name for p in phases.every()]
    for phase in phases.every():  # each after what it reads, but within a circle
        circle = next(g for g in phases.groups() if phase in g)
        assert all(order.index(r) < order.index(phase.name)
                   for r in phase.reads if r not in {p.name for p in circle})


def test_dvc_yaml_is_made_from_the_phases_declarations():
    """`gradleak dvc-yaml > dvc.yaml` after changing a phase: no second hand-kept graph."""
    assert (REPO / "dvc.yaml").read_text() == dvc.dvc_yaml(REPO)


def test_a_second_clone_names_its_own_files_and_says_when_the_imported_package_differs(
        tmp_path):
    """A reviewer's clone whose environment imports the first checkout's package (an
    editable install made there): dvc.yaml names the clone's files, relative, and the jobs'
    digests read them; once the clone's files differ, `gradleak dvc-yaml` (and every
    snakemake start) says so in one line."""
    import subprocess
    import sys

    from project import ENV, copy_project

    clone = copy_project(tmp_path / "review")
    config = configuration.load(REPO / "config" / "test.yaml")
    aggregate = phases.load("aggregate")
    imported = code.job_digest(aggregate, config, tmp_path, {}, REPO)

    def dvc_yaml():
        made = subprocess.run([sys.executable, "-m", "gradleak.cli", "dvc-yaml"], cwd=clone,
                              env=ENV, capture_output=True, text=True, check=True)
        assert made.stdout == (clone / "dvc.yaml").read_text()
        return made.stderr.splitlines()

    assert dvc_yaml() == []
    figures = clone / "src" / "gradleak" / "report" / "figures.py"
    figures.write_text(figures.read_text() + "\n# an edit in the clone\n")
    warning = dvc_yaml()
    assert len(warning) == 1 and warning[0].startswith("gradleak: warning: the imported package")
    assert str(code.ROOT) in warning[0] and str(figures.parents[1]) in warning[0]
    assert code.job_digest(aggregate, config, tmp_path, {}, clone) != imported


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("scale", ["full", "reduced", "smoke"])
def test_every_shipped_plan_reads_only_the_phases_each_declares(path, scale, tmp_path):
    """``Phase.reads`` (DVC's stage dependencies) holds every phase whose outputs a job of
    the walk reads, in every configuration the project ships (the walk refuses one that
    does not, next test)."""
    config = configuration.validate({**cfg.read(path), "scale": scale})
    jobs = pipeline.walk(config, tmp_path)
    assert jobs["fl_run"] and jobs["aggregate"]


def test_a_job_reading_a_phase_its_own_does_not_declare_stops_the_plan(monkeypatch, tmp_path):
    """Decision 0108: for any configuration, not only the shipped ones; the error names the
    phase to add."""
    import dataclasses

    config = configuration.load(REPO / "config" / "test.yaml")
    load = phases.load
    attack = load("attack")
    forgetful = dataclasses.replace(attack, reads=tuple(r for r in attack.reads
                                                        if r != "fl_run"))
    monkeypatch.setattr(phases, "load", lambda name: forgetful if name == "attack"
                        else load(name))
    with pytest.raises(ValueError, match=r"phase 'attack': job .* an output of phase "
                                         r"'fl_run'; expected 'fl_run' in its reads"):
        pipeline.walk(config, tmp_path)


def test_a_phase_that_gathers_what_it_does_not_read_is_refused():
    import dataclasses

    aggregate = phases.load("aggregate")
    with pytest.raises(ValueError, match="gathers .* expected each in its reads"):
        dataclasses.replace(aggregate, reads=aggregate.reads[1:])


def _code(name: str) -> set[str]:
    return {str(p.relative_to(code.ROOT)) for p in code.closure(
        [phases.module_name(name)])}


def test_a_job_s_code_is_what_its_phase_imports():
    fl, attack, aggregate = _code("fl_run"), _code("attack"), _code("aggregate")
    assert "fl/server.py" in fl and "defenses/soteria.py" in fl
    assert not any(f.startswith(("attacks/", "report/")) for f in fl)
    assert "attacks/dlg.py" in attack and "report/figures.py" not in attack
    assert "report/figures.py" in aggregate and "report/figures.py" in _code("target")
    data = _code("prepare_data")
    assert not any(f.startswith(("attacks/", "defenses/", "fl/", "report/", "models/"))
                   for f in data), data
    planning = {"cli.py", "experiment/cluster.py", "experiment/estimate.py",
                "experiment/configuration.py", "experiment/code.py"}
    assert not any(planning & _code(name) for name in phases.NAMES)


def test_a_job_s_code_includes_the_loaders_of_what_it_loads(tmp_path):
    """Refiner's FL run loads the evaluation network through train_evalnet's loader: an
    edit there re-runs it, not the undefended run."""
    config = configuration.load(REPO / "config" / "test.yaml")
    fl = phases.load("fl_run")
    plain = typed({"case": "digits-lenet-iid-k4", "setting": "none-0", "seed": "0"})
    refiner = {**plain, "setting": typed({"setting": "refiner-0.1"})["setting"]}
    root = code.ROOT.parent.parent
    loader = "src/gradleak/experiment/phases/train_evalnet.py"
    assert loader in code.job_files(fl, config, tmp_path, refiner, root)
    assert loader not in code.job_files(fl, config, tmp_path, plain, root)


def test_every_phase_is_a_command_and_a_stage():
    """Everything reads the declarations: the CLI's commands and DVC's stages list every
    phase (a new module under phases/ is all it takes)."""
    from gradleak import cli

    help_text = cli._parser().format_help()
    text = dvc.dvc_yaml(REPO)
    for phase in phases.every():
        assert phase.command in help_text
        assert f"all_{phase.name}" in text


def test_the_package_loads_no_subpackage_until_used():
    """`import gradleak` and a phase module's package import nothing else: a job loads the
    code it runs."""
    import subprocess
    import sys

    probe = ("import sys, gradleak, gradleak.experiment.phases; "
             "print(sorted(m for m in sys.modules if m.startswith('gradleak')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert "gradleak.attacks" not in out and "gradleak.experiment.phases.attack" not in out
    assert Path(code.file_of("gradleak")).name == "__init__.py"
