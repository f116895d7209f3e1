"""Cluster resources from the environment and the budgets, and `gradleak verify`'s errors."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO

from gradleak.experiment import cluster, configuration, phases, pipeline, plan


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("ACCOUNT", "PARTITION", "GPU_PARTITION", "GPUS", "GPU_MODEL", "RATE"):
        monkeypatch.delenv(f"GRADLEAK_SLURM_{name}", raising=False)


TEST = configuration.load(REPO / "config" / "test.yaml")  # device: auto, a LeNet case
REFINER = configuration.load(REPO / "config" / "paper" / "refiner.yaml")


def on(config: dict, device: str) -> dict:
    return {**config, "device": device}


def per_job(out: dict, **wildcards) -> dict:
    """A rule's resources for one job: the per-job ones called with its wildcards."""
    job = SimpleNamespace(**wildcards)
    return {key: value(job) if callable(value) else value for key, value in out.items()}


def resources(rule: str, config: dict) -> dict:
    return cluster.resources(phases.load(rule), config)


def test_gpu_rules_ask_for_a_gpu_and_cpu_rules_do_not(monkeypatch):
    monkeypatch.setenv("GRADLEAK_SLURM_ACCOUNT", "lab42")
    monkeypatch.setenv("GRADLEAK_SLURM_GPU_MODEL", "a100")
    job = {"case": "digits-lenet-iid-k4", "setting": "none-0", "seed": "0"}
    attack = per_job(resources("attack", TEST), **job)
    fl = per_job(resources("fl_run", TEST), **job)
    assert attack.pop("runtime") > cluster.STARTUP_MINUTES
    assert fl.pop("runtime") > cluster.STARTUP_MINUTES
    assert attack == {"mem_mb": 16000, "slurm_partition": "gpu", "gpu": 1,
                      "cpus_per_gpu": 4, "gpu_model": "a100", "slurm_account": "lab42"}
    assert fl == {"mem_mb": 2000, "slurm_partition": "cpu", "gpu": 0,
                  "cpus_per_gpu": 0, "gpu_model": "", "slurm_account": "lab42"}
    assert resources("train_gan", TEST)["runtime"] == cluster.FIXED_MINUTES


def gpu_rules(config: dict, case: str = "digits-lenet-iid-k4") -> set[str]:
    """The phases (every one the registry holds) whose first planned job, of ``case`` where
    it has one, asks for a GPU."""
    walked = pipeline.walk(config, REPO / "results")
    asking = set()
    for phase in phases.every():
        jobs = [job for job in walked[phase.name] if job.get("case", case) == case]
        wildcards = {k: getattr(v, "text", v) for k, v in (jobs or [{}])[0].items()}
        if jobs and per_job(resources(phase.name, config), **wildcards).get("gpu"):
            asking.add(phase.name)
    return asking


def test_every_phase_is_placed_by_the_configurations_these_tests_read():
    """Each phase of the registry has jobs in the configurations whose placement is checked
    here (the embedded test one, with LTI's inverter, and Refiner's studies and targets)."""
    with_lti = configuration.validate({**TEST, "attacks": {**TEST["attacks"], "lti": {}}})
    planned = {name for config in (TEST, with_lti, REFINER)
               for name, jobs in pipeline.walk(config, REPO / "results").items() if jobs}
    assert planned == {phase.name for phase in phases.every()}
    assert "train_inverter" not in gpu_rules(with_lti)  # by its model: a LeNet's on CPUs
    assert "train_inverter" in gpu_rules(on(with_lti, "cuda"))
    case = pipeline.walk(REFINER, REPO / "results")["attack"][0]["case"]
    assert not gpu_rules(REFINER, case) & {"prepare_data", "target", "aggregate"}


def test_auto_asks_a_gpu_where_it_pays_cuda_everywhere_it_runs_cpu_nowhere():
    heavy = {"train_evalnet", "train_gan", "train_giml", "attack", "train_zoo",
             "fit_adversaries"}
    assert gpu_rules(TEST) == heavy  # LeNet FL runs stay on CPUs
    assert gpu_rules(on(TEST, "cuda")) == heavy | {"fl_run", "attribute"}
    assert gpu_rules(on(TEST, "cpu")) == set()
    resnet = configuration.validate({**TEST, "cases": [
        {"dataset": "digits", "model": "resnet18", "partition": {"kind": "iid", "clients": 4}}]})
    assert gpu_rules(resnet, "digits-resnet18-iid-k4") == heavy | {"fl_run", "attribute"}


def test_auto_runs_l_bfgs_attack_jobs_on_a_lenet_on_cpus():
    """EPAFL's attack jobs run only DLG/iDLG (L-BFGS) on LeNets: on CPUs under auto; a job
    with any other attack, or on another model, asks for a GPU."""
    epafl = configuration.load(REPO / "config" / "paper" / "epafl.yaml")
    out = resources("attack", epafl)
    jobs = plan.attack_jobs(epafl)
    assert len(jobs) == 34
    assert {per_job(out, case=case, setting=setting.text, seed="0")["slurm_partition"]
            for case, setting in jobs} == {"cpu"}
    case, setting = next(iter(jobs))
    assert per_job(resources("attack", on(epafl, "cuda")), case=case, setting=setting.text,
                   seed="0")["gpu"] == 1
    mixed = per_job(resources("attack", TEST), case="digits-lenet-iid-k4",
                    setting="none-0", seed="0")  # DLG, iDLG and Adam attacks
    assert mixed["gpu"] == 1
    resnet = configuration.validate({**epafl, "cases": [
        {"dataset": "digits", "model": "resnet18", "partition": {"kind": "iid", "clients": 4}}],
        "targets": {}, "reference": {}, "claims": [], "regime": {}})
    case, setting = next(iter(plan.attack_jobs(resnet)))
    assert per_job(resources("attack", resnet), case=case, setting=setting.text,
                   seed="0")["gpu"] == 1


@pytest.mark.parametrize("device, expected", [
    ("auto", {"table5"}),                     # defense_cost times on the device
    ("cuda", {"table5", "fig4", "fig5"}),     # evalnet_blend runs there, refused without one
    ("cpu", set()),
])
def test_a_study_asks_a_gpu_only_when_it_times_on_the_device_or_needs_one(device, expected):
    config = on(REFINER, device)
    out = resources("study", config)
    asked = {name for name in plan.studies(config) if per_job(out, name=name).get("gpu")}
    assert asked == expected
    partitions = {per_job(out, name=name)["slurm_partition"] for name in plan.studies(config)}
    assert partitions == ({"gpu", "cpu"} if expected else {"cpu"})


def test_without_a_gpu_partition_auto_runs_on_cpus_and_cuda_is_refused(monkeypatch):
    monkeypatch.setenv("GRADLEAK_SLURM_GPU_PARTITION", "")
    assert gpu_rules(TEST) == set()
    assert resources("attack", TEST)["slurm_partition"] == "cpu"
    with pytest.raises(cluster.ClusterError, match="device 'cuda' needs GPUs on the cluster, "
                       "but GRADLEAK_SLURM_GPU_PARTITION is empty"):
        resources("prepare_data", on(TEST, "cuda"))
    monkeypatch.setenv("GRADLEAK_SLURM_GPU_PARTITION", "gpu")
    monkeypatch.setenv("GRADLEAK_SLURM_GPUS", "0")
    with pytest.raises(cluster.ClusterError, match="but GRADLEAK_SLURM_GPUS=0; expected"):
        resources("prepare_data", on(TEST, "cuda"))


@pytest.mark.parametrize("name, value, expected", [
    ("GRADLEAK_SLURM_GPUS", "two", "expected a number"),
    ("GRADLEAK_SLURM_GPUS", "1.5", "expected a whole number"),
    ("GRADLEAK_SLURM_GPUS", "-1", "expected a number >= 0"),
    ("GRADLEAK_SLURM_RATE", "0", "expected a rate > 0"),
    ("GRADLEAK_SLURM_RATE", "inf", "expected a number >= 0"),
])
def test_a_bad_variable_is_named_with_its_value(monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    with pytest.raises(cluster.ClusterError, match=f"{name}=.*{expected}"):
        resources("prepare_data", TEST)


def test_attack_wall_time_grows_with_the_budget_and_falls_with_the_rate(monkeypatch,
                                                                         tmp_path):
    attack = phases.load("attack")

    def longest(config: dict) -> int:
        return max(cluster.minutes(attack, config, tmp_path, job)
                   for job in pipeline.walk(config, tmp_path)["attack"])

    paper = configuration.load(REPO / "config" / "paper" / "epafl.yaml")
    test = configuration.load(REPO / "config" / "test.yaml")
    slow = longest(paper)
    assert slow > longest(test)
    monkeypatch.setenv("GRADLEAK_SLURM_RATE", "50")
    fast = longest(paper)
    assert cluster.STARTUP_MINUTES < fast < slow
    assert slow - cluster.STARTUP_MINUTES == pytest.approx(
        10 * (fast - cluster.STARTUP_MINUTES), abs=10)


@pytest.mark.slow
def test_verify_without_a_lock_names_the_file(tmp_path):
    run = subprocess.run([sys.executable, "-m", "gradleak.cli", "verify", "--root", str(tmp_path)],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert f"{tmp_path}/dvc.lock: no dvc.lock" in run.stderr


PROFILES = REPO / "workflow" / "profiles"


def test_the_array_profile_is_the_slurm_profile_with_arrays_of_workflow_rules():
    plain = yaml.safe_load((PROFILES / "slurm" / "config.yaml").read_text())
    array = yaml.safe_load((PROFILES / "slurm-array" / "config.yaml").read_text())
    assert {k: v for k, v in array.items() if not k.startswith("slurm-array")} == plain
    rules = set(phases.NAMES)  # one rule per phase (workflow/rules/phases.smk)
    named = {rule.strip() for rule in array["slurm-array-jobs"].split(",")}
    assert named and named <= rules, named - rules


def test_a_unit_without_an_assumed_cluster_rate_is_an_error_not_zero():
    assert cluster._seconds("defend:e30:lenet:1x16x16:10::b8") == 0.0  # said to count 0
    with pytest.raises(cluster.ClusterError, match="no assumed cluster rate for the unit "
                                                   "'gan_step:1:16:8:b4'"):
        cluster._seconds("gan_step:1:16:8:b4")
