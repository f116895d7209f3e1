"""Paper configurations: their plans hold only what their targets need, the manual's smoke
command of EPAFL runs verbatim in a fresh copy and every other one plans the jobs that make
all of its targets, and the manual's table of targets is the one the configurations
generate."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import in_process
import pandas as pd
import pytest
import torch
from conftest import REPO
from project import ENV, copy_project, run

from gradleak import config as cfg
from gradleak.experiment import catalog, configuration, plan, priors
from gradleak.experiment.phases.aggregate import undeclared_departures
from gradleak.models.ported import architecture
from gradleak.report.verdicts import CLAIM_COLUMNS
from gradleak.utils.io import save_torch

PAPERS = sorted((REPO / "config" / "paper").glob("*.yaml"))
PAPERS_PAGE = (REPO / "docs" / "papers.md").read_text()  # Reproducing a paper
CONFIGURATION_PAGE = (REPO / "docs" / "configuration.md").read_text()


def smoke_command(paper: str) -> str:
    """The manual's one-line smoke command for ``config/paper/<paper>.yaml``."""
    lines = [line.strip().strip("`") for line in PAPERS_PAGE.splitlines()
             if "snakemake" in line and f"config/paper/{paper}.yaml" in line and "smoke" in line]
    assert len(lines) == 1, f"docs/papers.md needs one smoke line for {paper}, found {lines}"
    return lines[0]


@pytest.mark.slow
def test_epafl_plans_only_dlg_and_idlg_without_gan_or_evaluation_network(tmp_path):
    """`snakemake -n` on EPAFL: the undefended setting, attacked only by DLG and iDLG
    (with and without early stopping), and no GAN or evaluation-network training."""
    root = copy_project(tmp_path / "project")
    proc = run([*shlex.split("snakemake -n --configfile config/paper/epafl.yaml")], root)
    jobs = re.findall(r"^(?:local)?rule (\w+):", proc.stdout, flags=re.M)
    assert set(jobs) == {"prepare_data", "fl_run", "attack", "target", "aggregate", "all"}
    settings = set(re.findall(r"wildcards: case=[^,]+, setting=([^,\n]+)", proc.stdout))
    config = configuration.load(REPO / "config" / "paper" / "epafl.yaml")
    assert settings == {s.text for s in plan.settings(config)}
    assert {s.split("~")[0] for s in settings} == {"none-0"}
    registered = {plan.attack_of(config, label)[0]
                  for labels in plan.jobs(config).values() for label in labels}
    assert registered == {"dlg", "idlg"}
    assert "MNIST" in proc.stderr  # the missing dataset is named, the dry run goes on


def planning_weights(root: Path, config: str) -> None:
    """Each pretrained prior's weights file in its real format with the architecture's keys
    and shapes, every tensor a broadcast view of one zero (a few kB; planning reads the keys
    and shapes, no tensor data)."""
    resolved = configuration.load(REPO / config)
    for dataset in priors.pretrained_datasets(resolved):
        gan = priors.spec(resolved, dataset)
        build, arguments = architecture(gan)
        with torch.device("meta"):
            shapes = {k: v.shape for k, v in build(**arguments).state_dict().items()}
        state = {k: torch.zeros(()).expand(shape) for k, shape in shapes.items()}
        path = root / gan["weights"]
        path.parent.mkdir(parents=True, exist_ok=True)
        save_torch(path, {"g_ema": state} if gan["kind"] == "stylegan2" else state)


@pytest.mark.slow
def test_gias_full_mode_waits_for_its_stylegan2_files_and_plans_dcgans_only_when_asked(tmp_path):
    """`snakemake -n` on GIAS: without the StyleGAN2 weights it stops before any job naming
    `gan.weights`; with them, the attacks read the files, one DCGAN is trained (Fig. 6's
    wrong prior of CIFAR-10), GIML's generator for the FFHQ case only, no evaluation
    network, every one of the ten targets; the manual's `--config "gan={kind: dcgan}"`
    trains a DCGAN for every dataset a prior is of instead."""
    root = copy_project(tmp_path / "project")
    command = shlex.split("snakemake -n --configfile config/paper/gias.yaml")
    proc = run(command, root, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("gradleak: ")] == [
        "gradleak: gan.weights: 'priors/stylegan2-imagenet64.pt' does not exist (stylegan2 "
        "loads imagenet's generator from it: expected a rosinality/stylegan2-pytorch "
        "checkpoint holding 'g_ema', or the bare g_ema state dict, downloaded to that path; "
        "from no public file: GIAS's authors trained theirs (their README: bring your own); "
        "rosinality/stylegan2-pytorch's train.py --size 64 on ImageNet's train split, saved "
        "as {'g_ema': ...}); or run DCGANs trained here: --config 'gan={kind: dcgan}'"]
    assert not (root / "results").exists(), "a job could start"

    planning_weights(root, "config/paper/gias.yaml")
    proc = run(command, root)
    jobs = re.findall(r"^(?:local)?rule (\w+):", proc.stdout, flags=re.M)
    assert "train_evalnet" not in jobs and jobs.count("train_giml") == 1
    assert set(re.findall(r"results/gan/(\w+)\.pt", proc.stdout)) == {"cifar10"}
    assert {"priors/stylegan2-imagenet64.pt", "priors/stylegan2-ffhq-config-f.pt"} <= set(
        re.findall(r"priors/[\w.-]+", proc.stdout))
    assert re.findall(r"results/giml/([\w-]+)\.pt", proc.stdout)[0].startswith("ffhq-resnet18")
    targets = set(re.findall(r"results/targets/(\w+)", proc.stdout))
    assert targets == {"table1", "fig1", "fig3", "fig4", "fig5", "fig6", "figa1", "figa2",
                       "figa3", "figa4"}

    dcgan = [line for line in CONFIGURATION_PAGE.splitlines() if "gan={kind: dcgan}" in line
             and line.startswith("snakemake")]  # the manual's command, dry
    proc = run([*shlex.split(dcgan[0]), "-n"], root)
    assert set(re.findall(r"results/gan/(\w+)\.pt", proc.stdout)) == {
        "imagenet", "ffhq", "cifar10"}
    assert "priors/" not in proc.stdout


def assert_every_target_made(results: Path, config: dict, compared: str) -> None:
    """Each target's table, panels and comparison with the paper are there, the report has
    a section per target, and ``gradleak compare`` (its output ``compared``, lines of at
    most 100 characters) pairs rows of each target that has the paper's numbers; every
    claim is judged in claims.csv, which opens the report and the comparison."""
    for name, target in config["targets"].items():
        folder = results / "targets" / name
        files = {p.name for p in folder.iterdir()}
        assert ("table" not in target) or f"{name}.csv" in files, (name, files)
        assert {f"{name}{panel}.png" for panel, _ in cfg.figure_specs(target)} <= files, (
            name, files)
        assert (name not in config["reference"]) or f"{name}_vs_paper.csv" in files
    report = (results / "report.md").read_text()
    assert all(f"the paper: {d['paper']}; ours: {d['ours']}." in report
               for d in config["departures"])
    assert all(f"## {name}:" in report for name in config["targets"])
    assert all(f"{name}: " in compared for name in config["reference"])
    summary = compared[compared.index("pairs of rows ordered as in the paper"):]
    assert all(re.search(rf"^  {name} +(\d+/\d+|- )", summary, re.M)
               for name in config["reference"]), summary
    assert re.search(r"^  all +\d+/\d+$", summary, re.M), summary
    claims = pd.read_csv(results / "claims.csv", keep_default_na=False)
    assert list(claims.columns) == CLAIM_COLUMNS
    assert claims["claim"].tolist() == [c["id"] for c in config["claims"]]
    assert set(claims["verdict"]) == {"untestable"}  # smoke scale: no paper's regime
    assert claims["why"].str.contains("smoke scale").all()
    assert set(claims["scale"]) == {"smoke"} and set(claims["data"]) <= {"paper", "stand-in"}
    # the report opens with the verdicts; `gradleak compare` prints them first
    assert [line for line in report.splitlines() if line.startswith("## ")][0] == \
        "## Does the paper's claim hold?"
    assert compared.startswith(f"claims of {config['paper']}: ")
    assert all(f"  {c['id']} (" in compared for c in config["claims"])
    assert max(map(len, compared.splitlines())) <= 100


@pytest.mark.slow
@pytest.mark.parametrize("paper", [p.stem for p in PAPERS])
def test_smoke_plan_runs_every_target(paper, tmp_path):
    """Every smoke line of the manual plans, as a dry run, the jobs that its configuration's plan
    runs here in one process (``in_process``: the same job functions, each making the
    outputs its rule declares, without a Snakemake job's process: EPAFL's 48 jobs took 465
    s through Snakemake in the suite, 101 s here); one target is then re-made through
    Snakemake, and the targets are all there; `gradleak compare` pairs their rows with the
    paper's."""
    root = copy_project(tmp_path / "project")
    dry = subprocess.run(f"{smoke_command(paper)} -n --quiet rules", shell=True, cwd=root,
                         env=ENV, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr[-4000:]
    planned = dict(re.findall(r"^(\w+) +(\d+)$", dry.stdout + dry.stderr, flags=re.M))
    # the dry run names each claim the smoke scale cannot decide, before any job
    untestable = re.findall(r"^gradleak: claim (\S+) is untestable at scale smoke: smoke scale",
                            dry.stderr, flags=re.M)
    results = root / "results"
    config = in_process.resolved(root / "config" / "paper" / f"{paper}.yaml", results,
                                 scale="smoke")
    assert untestable == [c["id"] for c in config["claims"]]
    ran = in_process.run_plan(config, results)
    assert {**ran, "all": 1, "total": sum(ran.values()) + 1} == {
        rule: int(n) for rule, n in planned.items()}
    # one target re-made through Snakemake on what the plan made: its rule alone runs
    first = sorted(config["targets"])[0]
    shutil.rmtree(results / "targets" / first)
    again = subprocess.run(smoke_command(paper).replace(
        "snakemake ", f"snakemake results/targets/{first} ", 1), shell=True, cwd=root, env=ENV,
        capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-4000:]
    assert dict(re.findall(r"^(\w+) +(\d+)$", again.stderr.split("Job stats:")[1],
                           flags=re.M)) == {"target": "1", "total": "1"}
    compared = subprocess.run("gradleak compare --config results/config.resolved.json",
                              shell=True, cwd=root, env=ENV, capture_output=True, text=True)
    assert compared.returncode == 0, compared.stderr
    assert_every_target_made(results, config, compared.stdout)


@pytest.mark.slow
def test_manual_targets_table_is_generated_from_the_configs(monkeypatch):
    monkeypatch.chdir(REPO)
    begin, end = "<!-- targets:begin -->\n", "<!-- targets:end -->"
    table = PAPERS_PAGE[PAPERS_PAGE.index(begin) + len(begin):PAPERS_PAGE.index(end)]
    assert table == catalog.targets_table([p.relative_to(REPO) for p in PAPERS])
    cli = subprocess.run([sys.executable, "-m", "gradleak.cli", "targets",
                          *[str(p.relative_to(REPO)) for p in PAPERS]], cwd=REPO, env=ENV,
                         capture_output=True, text=True)
    assert cli.returncode == 0 and cli.stdout == table


@pytest.mark.parametrize("paper", [p.stem for p in PAPERS])
def test_every_substitution_of_a_full_run_is_a_listed_departure(paper):
    """A prior trained in the pipeline, an evaluation network on the bundled images or a
    stand-in dataset in full mode is named by a `departures:` entry (each with the paper's
    way, ours and why), so that the report says it."""
    config = configuration.load(REPO / "config" / "paper" / f"{paper}.yaml")
    assert config["departures"] and all(d["paper"] and d["ours"] and d["why"]
                                        for d in config["departures"])
    assert undeclared_departures(config, Path("results")) == []


def test_an_unlisted_substitution_is_found_and_a_bad_departure_key_refused():
    gias = cfg.read(REPO / "config" / "paper" / "gias.yaml")
    config = configuration.validate({
        **gias, "departures": [], "gan": {**gias["gan"], "kind": "dcgan"},
        "datasets": {**gias["datasets"], "cifar10": {"stand_in": "digits"}}})
    assert undeclared_departures(config, Path("results")) == [
        "datasets.cifar10.stand_in", "gan.kind"]
    with pytest.raises(cfg.ConfigError, match=r"'departures\[0\].key': 'gan.knd' is not a"):
        configuration.validate({**gias, "departures": [
            {"key": "gan.knd", "paper": "p", "ours": "o", "why": "w"}]})


def test_the_catalog_names_the_data_and_files_of_the_jobs_a_target_plans():
    """Refiner Tables 1-2 select the centralised case (`clients: [1]`), only CIFAR-10's;
    Fig. 4's evaluation network trains on TinyImageNet; GIAS Table 1 reads its StyleGAN2
    file, Fig. 6 (DCGANs and GIML's generator) none."""
    table = catalog.targets_table([REPO / "config" / "paper" / "refiner.yaml",
                                   REPO / "config" / "paper" / "gias.yaml"])
    rows = {tuple(line.split(" | ")[:2]): line for line in table.splitlines()[2:]}
    assert rows[("| refiner", "table1")].endswith("| no: needs cifar10 |")
    assert rows[("| refiner", "table2")].endswith("| no: needs cifar10 |")
    assert "\\|w\\|" in rows[("| refiner", "table1")]  # a title's | is no cell border
    assert rows[("| refiner", "fig4")].endswith(
        "| no: needs cifar10, cifar100, svhn, tinyimagenet |")
    assert rows[("| gias", "table1")].endswith(
        "| no: needs imagenet, priors/stylegan2-imagenet64.pt |")
    assert rows[("| gias", "fig6")].endswith("| no: needs cifar10, ffhq |")


def test_every_paper_config_has_a_smoke_line_in_the_manual():
    for paper in PAPERS:
        assert "--config scale=smoke" in smoke_command(paper.stem)
