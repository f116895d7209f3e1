"""`gradleak estimate`: jobs per target counted as Snakemake runs them, costs linear in the
budgets, the calibration cached per machine, a bad target named with the known ones."""

from __future__ import annotations

import csv
import io
import platform
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO
from project import SNAKEMAKE, copy_project, run

from gradleak import cli
from gradleak import config as cfg
from gradleak.experiment import cluster, configuration, estimate, phases, pipeline, plan
from gradleak.experiment.phases.attack import attack_iterations, attack_work

TEST = REPO / "config" / "test.yaml"
TARGETS = {  # fig2 needs every run of table1 and more: they share jobs
    "table1": {"title": "one", "select": [{"defenses": ["none"], "attacks": ["dlg"]}]},
    "fig2": {"title": "two", "select": [{"defenses": ["none", "dp_gaussian"],
                                        "attacks": ["dlg", "idlg"]}]},
}


def configured(tmp_path, **changes) -> tuple[dict, str]:
    """config/test.yaml with ``changes`` (dotted paths), validated, and its file."""
    raw = yaml.safe_load(TEST.read_text())
    for key, value in changes.items():
        cfg.set_path(raw, key, value)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return configuration.load(path), str(path)


@pytest.fixture
def one_second_units(monkeypatch):
    """Every unit of work costs one second: hours are the work / 3600, nothing measured."""
    monkeypatch.setattr(estimate, "calibrate",
                        lambda units, device="cpu", threads=None: dict.fromkeys(units, 1.0))


def estimate_csv(capsys, *args) -> list[dict]:
    assert cli.main(["estimate", *args, "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "target,jobs,cpu_hours,gpu_hours"
    return list(csv.DictReader(io.StringIO(out)))


def test_csv_has_a_row_per_target_and_a_total_counting_shared_jobs_once(
        tmp_path, capsys, one_second_units):
    config, path = configured(tmp_path, targets=TARGETS)
    rows = estimate_csv(capsys, "--config", path, "--results", str(tmp_path / "results"))
    assert [r["target"] for r in rows] == ["table1", "fig2", "total"]
    jobs = {r["target"]: int(r["jobs"]) for r in rows}
    hours = {r["target"]: float(r["cpu_hours"]) for r in rows}
    # table1's runs are fig2's; only its target job is its own
    assert jobs["table1"] < jobs["fig2"] < jobs["total"] == jobs["fig2"] + 1
    assert hours["fig2"] < hours["total"] < hours["table1"] + hours["fig2"]
    cuda = torch.cuda.is_available()
    assert all((r["gpu_hours"] != "") == cuda for r in rows)
    alone = estimate_csv(capsys, "--config", path, "--results", str(tmp_path / "results"),
                         "table1")
    assert [r["target"] for r in alone] == ["table1", "total"]
    assert alone[0]["jobs"] == alone[1]["jobs"] == rows[0]["jobs"]


def test_a_configuration_without_targets_has_one_row_all(tmp_path, capsys, one_second_units):
    rows = estimate_csv(capsys, "--config", str(TEST), "--results", str(tmp_path))
    assert [r["target"] for r in rows] == ["all", "total"]
    assert rows[0]["jobs"] == rows[1]["jobs"] == "20"


@pytest.mark.slow
def test_smoke_prices_the_smoke_overrides(tmp_path, capsys, one_second_units):
    paper = str(REPO / "config" / "paper" / "epafl.yaml")
    full, smoke = (estimate_csv(capsys, "--config", paper, "--results", str(tmp_path), *extra)
                   for extra in ([], ["--scale", "smoke"]))
    assert [r["target"] for r in full] == [r["target"] for r in smoke]
    assert float(smoke[-1]["cpu_hours"]) < float(full[-1]["cpu_hours"])


@pytest.mark.slow
def test_jobs_are_the_ones_snakemake_runs(tmp_path):
    config = configuration.load(TEST)
    counted = Counter(job.rule for job in estimate.jobs(config, tmp_path / "results").values())
    out = pipeline.walk(config, tmp_path / "results")
    assert counted["fl_run"] == len(out["fl_run"]) and counted["attack"] == len(out["attack"])
    assert counted["attribute"] == len(out["attribute"])
    assert counted["fit_adversaries"] == len(plan.adversary_jobs(config)) * len(
        config["fl"]["seeds"])
    root = copy_project(tmp_path / "project")
    dry = run([*SNAKEMAKE, "-n", "--cores", "1", "--configfile", "config/test.yaml"], root)
    stats = dry.stdout[dry.stdout.index("Job stats"):]
    planned = Counter({rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", stats, re.M)
                       if rule not in ("all", "total")})
    assert planned == counted


def test_cost_grows_linearly_with_rounds_and_iterations(tmp_path, one_second_units):
    def hours(**changes) -> float:
        config, _ = configured(tmp_path, **changes)
        return estimate.estimate(config, results=tmp_path / "results")[-1]["cpu_hours"]

    for key, values in (("fl.rounds", (4, 8, 12)), ("attacks.dlg.iterations", (2, 4, 6)),
                        ("attack.victims.count", (1, 2, 3))):
        one, two, three = (hours(**{key: v}) for v in values)
        assert two - one == pytest.approx(three - two) and two > one, key
    config, _ = configured(tmp_path)
    step = 1 / 3600  # one FL step or one defended upload, one second
    fl_steps = config["fl"]["rounds"] * 4 * config["fl"]["local_steps"]  # 4 clients, all
    uploads = config["fl"]["rounds"] * 4
    # 5 runs; every upload priced but recupfl's (its zoo)
    assert hours(**{"fl.rounds": 8}) - hours() == pytest.approx((5 * fl_steps + 4 * uploads)
                                                                * step)


def test_a_defended_upload_is_priced_with_its_defense_and_stand_ins(tmp_path, monkeypatch):
    """An FL run's uploads through Soteria or Refiner (an untrained evaluation network in
    place of the trained one) cost more than its plain SGD steps: the defense is priced."""
    config, _ = configured(tmp_path, **{"defenses.soteria": {"strengths": [0.5]}})
    found = estimate.jobs(config, tmp_path / "results")
    defended = {Path(first).parts[-3]: {u: n for u, n in job.work.items()
                                        if u.startswith("defend:")}
                for (rule, first), job in found.items() if rule == "fl_run"}
    assert defended["recupfl-0.01"] == {}  # the zoo: not priced
    (soteria, uploads), = defended["soteria-0.5"].items()
    (refiner, _), = defended["refiner-0.1"].items()
    assert uploads == config["fl"]["rounds"] * 4  # every client, every round
    monkeypatch.setenv("GRADLEAK_CACHE", str(tmp_path / "cache"))
    step = "fl_step:" + soteria.split(":", 2)[2]
    rates = estimate.calibrate([soteria, refiner, step], "cpu", threads=1)
    assert rates[soteria] > rates[step] and rates[refiner] > rates[step]


def test_a_defense_that_reads_the_gradient_alone_is_priced_per_upload_not_per_image(tmp_path):
    """Noise, pruning and quantisation (schema ``work: gradient``) are timed on the whole
    upload and not scaled by the batch: scaled from 8 images, as a per-sample defense is,
    they were priced 8x at batch 64 (m103)."""
    config, _ = configured(tmp_path, **{"defenses.soteria": {"strengths": [0.5]}})
    found = estimate.jobs(config, tmp_path / "results")
    kinds = {Path(first).parts[-3]: {u.split(":")[0] for u in job.work if "defend" in u}
             for (rule, first), job in found.items() if rule == "fl_run"}
    assert kinds["dp_gaussian-0.01"] == {"defend_gradient"}
    assert kinds["soteria-0.5"] == {"defend"} and kinds["refiner-0.1"] == {"defend"}
    unit = next(u for (rule, first), job in found.items() if rule == "fl_run"
                and "dp_gaussian" in first for u in job.work if u.startswith("defend_gradient"))
    assert estimate._timed_share(unit) == 1
    model_part = unit.rsplit(":b", 1)[0]
    assert estimate._timed_share(f"defend:{model_part.split(':', 1)[1]}:b64") == 1 / 8
    estimate._unit_call(f"{model_part}:b64", torch.device("cpu"))()  # the whole batch


def test_attack_iterations_follow_each_attack_s_stages():
    assert attack_iterations("dlg", {"iterations": 7}) == 7
    assert attack_iterations("gias", {"variant": "z/w", "latent_iterations": 3,
                                               "parameter_iterations": 5}) == 8
    assert attack_iterations("gifd", {"steps": [2, 3]}) == 5
    # GGL's CMA-ES matches each round's population (m92: 50 rounds of 50, 24 s a victim)
    assert attack_iterations("gga", {"optimizer": "cmaes", "iterations": 3, "population": 4}) == 12
    assert attack_iterations("gga", {"optimizer": "adam", "iterations": 3, "population": 4}) == 3
    assert attack_iterations("eot", {"samples": 4, "wraps_params": {
        "iterations": 5, "restarts": 2}}) == 40
    assert attack_iterations("rgap", {}) == 1  # closed form


def test_the_slurm_wall_time_counts_the_same_work(monkeypatch, tmp_path):
    """A timed phase's wall time is the work `gradleak estimate` prices, at the cluster's
    assumed rates: an attack job's iterations at GRADLEAK_SLURM_RATE, doubled, plus start-up."""
    monkeypatch.delenv("GRADLEAK_SLURM_RATE", raising=False)
    config = configuration.load(REPO / "config" / "paper" / "epafl.yaml")
    attack = phases.load("attack")
    job = pipeline.walk(config, tmp_path)["attack"][0]
    labels = plan.jobs(config)[job["case"], job["setting"]]
    work = sum(attack_work(plan.resolve(config, job["setting"]), labels, True).values())
    assert sum(attack.work(config, tmp_path, job).values()) == work
    assert cluster.minutes(attack, config, tmp_path, job) == cluster.STARTUP_MINUTES + -(
        -2 * work // (cluster.rate() * 60))


@pytest.mark.slow
def test_an_lbfgs_attack_is_priced_per_lbfgs_iteration_as_the_engine_runs_it(tmp_path,
                                                                             monkeypatch):
    config, _ = configured(tmp_path)
    found = estimate.jobs(config, tmp_path / "results")
    work = Counter()
    for job in found.values():
        if job.rule == "attack":
            work.update({unit.split(":")[0]: n for unit, n in job.work.items()})
    by_optimizer = Counter()
    for (_, setting), labels in plan.attack_jobs(config).items():
        by_optimizer.update(attack_work(plan.resolve(config, setting), labels))
    seeds = len(config["attack"]["attacker"]["seeds"])
    assert work["lbfgs"] == seeds * by_optimizer["lbfgs"] > 0  # dlg, idlg
    assert work["match"] == seeds * by_optimizer["adam"] > 0
    monkeypatch.setenv("GRADLEAK_CACHE", str(tmp_path / "cache"))
    unit, match = "lbfgs:lenet:1x8x8:10:True:b1", "match:lenet:1x8x8:10:True:b1"
    rates = estimate.calibrate([unit, match], "cpu", threads=1)
    # a line search of several evaluations and the loop's bookkeeping per iteration
    assert rates[unit] > rates[match]


@pytest.mark.slow
def test_the_calibration_is_cached_per_machine_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADLEAK_CACHE", str(tmp_path / "cache"))
    units = ["startup", "fl_step:lenet:1x32x32:10:True:b8", "match:lenet:1x32x32:10:True:b1",
             "mlp_step:64:b32", "gan_step:1:16:8:b4", "evalnet_step:1x32x32:[8, 16, 32]:b4"]
    rates = estimate.calibrate(units, "cpu", threads=1)
    assert set(rates) == set(units) and all(v > 0 for v in rates.values())
    path = tmp_path / "cache" / f"estimate-{platform.node()}-torch{torch.__version__}-cpu.json"
    assert estimate.cache_file("cpu") == path and path.is_file()
    measured = []
    real = estimate._unit_call
    monkeypatch.setattr(estimate, "_unit_call",
                        lambda unit, device: measured.append(unit) or real(unit, device))
    assert estimate.calibrate(units, "cpu", threads=1) == rates
    assert measured == []  # the second call reads the cache
    estimate.calibrate([*units, "fl_step:lenet:1x32x32:10:True:b4"], "cpu", threads=1)
    assert measured == ["fl_step:lenet:1x32x32:10:True:b4"]  # only the new unit


@pytest.mark.parametrize("config, expected", [
    ("targets", r"unknown target 'table9'; expected one of \['table1', 'fig2'\]"),
    ("plain", r"unknown target 'table9': this configuration has no targets"),
])
def test_an_unknown_target_is_named_with_the_known_ones(tmp_path, capsys, one_second_units,
                                                         config, expected):
    path = configured(tmp_path, targets=TARGETS)[1] if config == "targets" else str(TEST)
    assert cli.main(["estimate", "--config", path, "table9"]) == 2
    assert re.search(f"gradleak estimate: error: {expected}", capsys.readouterr().err)


def test_each_unit_kind_is_timed_by_the_phase_that_declares_it_and_an_unknown_one_is_refused():
    """No if-chain over unit kinds: a phase's own units (``Phase.units``) are timed through
    its timer, and a unit no phase declares stops the estimate naming it."""
    from gradleak.experiment import phases

    declared = {kind for phase in phases.every() for kind in phase.units}
    assert {"gan_step", "evalnet_step", "mlp_step", "inverter_step"} <= declared
    assert declared <= set(estimate.timers())
    estimate._unit_call("mlp_step:64:b4", torch.device("cpu"))()
    with pytest.raises(ValueError, match=r"unknown unit of work 'warp_step:3:b4'; expected one "
                                         r"of the kinds \[.*'inverter_step'"):
        estimate._unit_call("warp_step:3:b4", torch.device("cpu"))


def test_giml_is_priced_by_its_inner_iterations_through_the_generator(monkeypatch):
    """GIML's outer steps cost their inner searches through the generator it meta-learns
    (m101: a quarter of it when priced as image-space matches): one timed call runs
    ``share`` of them."""
    from gradleak.experiment.phases import train_giml

    unit = "giml_iteration:lenet:1x32x32:10:True:8:4:b1"
    estimate._unit_call(unit, torch.device("cpu"))()
    assert estimate._timed_share(unit) == 2 * train_giml.TIMED_ITERATIONS
    config = {"giml": {"outer_steps": 3, "tasks_per_step": 2, "latent_iterations": 5,
                       "parameter_iterations": 4, "batch_size": 1, "latent_dim": 8,
                       "width": 4}}
    monkeypatch.setattr(train_giml.cost, "model_unit",
                        lambda c, r, case, kind, b: f"{kind}:lenet:1x32x32:10:True:b{b}")
    assert train_giml._work(config, Path("results"), {"case": "c"}) == {unit: 3 * 2 * 9}


def test_local_epochs_on_an_attribute_stand_in_are_priced_over_its_shards():
    """RecUP-FL §6.4's clients train a local epoch over their shards: on an attribute
    dataset's stand-in (its size known before it is prepared, the digits' or the seeded
    noise's) that is many mini-batches an upload, not one."""
    from gradleak.data import attributes, datasets
    from gradleak.data.digits import DIGITS_COUNT
    from gradleak.experiment import cost

    assert datasets.size("lfw", {"stand_in": "digits"}) == DIGITS_COUNT
    assert datasets.size("adult", {"stand_in": "fake", "max_images": 400}) == 400
    assert datasets.size("adult", {"stand_in": "fake"}) == attributes.FAKE_COUNT
    assert datasets.size("lfw", {}) is None  # the real folder: known once prepared
    fl = {"rounds": 2, "participation": 1.0, "client_batch_size": 1, "local_steps": 1,
          "local_epochs": 1}
    train = datasets.split_capacity("lfw", {"stand_in": "digits"})
    epoch = cost.fl_steps({"fl": fl}, 10, train)
    step = cost.fl_steps({"fl": {**fl, "local_epochs": 0}}, 10, train)
    assert epoch == step * (train // 10)
