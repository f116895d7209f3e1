"""What each rule asks a cluster for: partition, GPU and account from the environment, wall
time from the configuration's budgets.

The SLURM profile (workflow/profiles/slurm) only chooses the executor (workflow/profiles/
slurm-array: the same, with the plugin's job arrays for the rules with many small jobs);
the rules' resources come from here, so a user adapts the profile in one place, their
environment:

    FEDLEAK_SLURM_ACCOUNT        account for every job (unset: the plugin guesses it)
    FEDLEAK_SLURM_PARTITION      partition of the CPU rules (default: cpu)
    FEDLEAK_SLURM_GPU_PARTITION  partition of the GPU jobs (default: gpu; empty: there is
                                 none, every job runs in the CPU partition)
    FEDLEAK_SLURM_GPUS           GPUs per GPU job (default: 1; 0 runs them on CPUs)
    FEDLEAK_SLURM_GPU_MODEL      GPU type, e.g. a100 (default: any)
    FEDLEAK_SLURM_RATE           attack iterations per second per victim that the wall time
                                 assumes (default: 5, ResNet-18 at 32x32 on one GPU, with
                                 a margin; raise it on fast GPUs, lower it on CPUs)

Wall time is the attack budget over that rate (victims x restarts x iterations, summed over
the job's attacks), doubled, plus 10 minutes of start-up; FL runs scale with rounds x
clients per round x local steps. The budgets are counted by ``experiment.estimate``
(``attack_work``, ``fl_steps``), the model `fedleak estimate` prices with measured rates.
Outside SLURM these resources are ignored.

**Which jobs ask for a GPU** (``gpu_job``) follows the configuration's ``device``: ``cpu``,
none; ``cuda``, every job that runs on the device (``DEVICE_RULES``: it would be refused on a
node without one); ``auto``, the jobs a GPU pays for, per rule:

- ``train_evalnet``, ``train_gan``: CNN / GAN training over epochs of a dataset;
  ``train_giml``: outer steps x tasks x gradient-matching iterations through a generator;
  ``attack``: victims x restarts x iterations of double-backward gradient matching, stacked
  problems in one batch (the papers time them on GPUs), except a job whose attacks all
  run L-BFGS (DLG, iDLG, EPAFL's) on a model in ``CPU_MODELS``: an L-BFGS iteration of a
  batch-1 LeNet took 1.6-2.8x longer on an H200 than on one of its CPU cores (up to 20
  evaluations of a tiny network, launch- and sync-bound; docs/decisions.md);
- ``train_zoo``, ``fit_adversaries``: RecUP-FL's zoo (``zoo_size`` networks per attribute)
  and neural adversaries, trained on per-sample gradients;
- ``fl_run`` and ``attribute`` (per-sample gradients of the case's model, the adversaries
  only inferring): by the case's model; a GPU unless it is in ``CPU_MODELS``. FedAvg LeNet
  took 8.58 s on the CPU and 4.15 s on an H200 (``benchmarks/fl_device.py``): a 2x that does
  not pay for a GPU against a CPU core, where ResNets gain far more;
- ``study``: by its kind (``studies.register(device=...)``): ``times`` (``defense_cost``, its
  seconds are the device's, as the papers time defenses on GPUs) asks for one, ``runs``
  (``evalnet_blend``: a few images through a network) only under ``device: cuda``;
- ``prepare_data``, ``target``, ``aggregate``: never (no model on a device).

``FEDLEAK_SLURM_GPU_PARTITION=""`` sends the ``auto`` jobs to the CPU partition; ``device:
cuda`` without a GPU partition or with ``FEDLEAK_SLURM_GPUS=0`` is refused before any job.
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping

from fedleak.attacks.base import registered
from fedleak.experiment import estimate, plan, studies
from fedleak.types import Setting

# the rules whose jobs run on the configuration's device (utils.device.select)
DEVICE_RULES = frozenset({"train_evalnet", "train_gan", "train_giml", "fl_run", "attack",
                          "train_zoo", "fit_adversaries", "attribute", "study"})
# under device: auto, the rules that ask for a GPU whatever the job (see the docstring)
GPU_RULES = frozenset({"train_evalnet", "train_gan", "train_giml", "attack", "train_zoo",
                       "fit_adversaries"})
CASE_RULES = frozenset({"fl_run", "attribute"})  # a GPU by the case's model
CPU_MODELS = frozenset({"lenet"})  # FedAvg LeNet: CPU 8.58 s, H200 4.15 s
MEMORY_MB = {"prepare_data": 2000, "fl_run": 2000}
GPU_MEMORY_MB = 16000
DEFAULT_MEMORY_MB = 4000
STARTUP_MINUTES = 10
FIXED_MINUTES = 120  # data, networks, priors, zoo, aggregation: well under on one GPU
FL_STEPS_PER_SECOND = 20


class ClusterError(ValueError):
    """An environment variable the cluster resources read has a value they cannot use."""


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ClusterError(f"{name}={text!r}: expected a number") from None
    if value < 0 or not math.isfinite(value):
        raise ClusterError(f"{name}={text!r}: expected a number >= 0")
    return value


def gpus() -> int:
    value = _env_number("FEDLEAK_SLURM_GPUS", 1)
    if value != int(value):
        raise ClusterError(f"FEDLEAK_SLURM_GPUS={value}: expected a whole number")
    return int(value)


def rate() -> float:
    value = _env_number("FEDLEAK_SLURM_RATE", 5)
    if value == 0:
        raise ClusterError("FEDLEAK_SLURM_RATE=0: expected a rate > 0")
    return value


def attack_minutes(config: Mapping, labels: tuple[str, ...]) -> int:
    """Wall time of one attack job: its victims x restarts x iterations at the assumed rate
    (x the uploads of a sequence victim, ``attack.sequence.steps``)."""
    work = sum(estimate.attack_work(config, labels).values())
    return STARTUP_MINUTES + math.ceil(2 * work / rate() / 60)


def fl_minutes(config: Mapping, clients: int) -> int:
    steps = estimate.fl_steps(config, clients)
    return STARTUP_MINUTES + math.ceil(2 * steps / FL_STEPS_PER_SECOND / 60)


def gpu_job(config: Mapping, rule: str, case: str | None = None,
            study: str | None = None, setting: str | None = None) -> bool:
    """Whether a job of ``rule`` (of case ``case``, of study target ``study``, of defense
    setting ``setting``) asks for a GPU under the configuration's ``device`` (the module's
    docstring has the reasons)."""
    device = config["device"]
    if device == "cpu" or rule not in DEVICE_RULES:
        return False
    if rule == "study":
        kind = studies.STUDIES[config["targets"][study]["study"]["kind"]].device
        return kind == "times" or (kind == "runs" and device == "cuda")
    if device == "cuda":
        return True
    if rule == "attack" and setting is not None:
        return not _lbfgs_on_cpu_model(config, case, Setting.parse(setting))
    if rule in GPU_RULES:
        return True
    return plan.find_case(config, case)["model"] not in CPU_MODELS


def _lbfgs_on_cpu_model(config: Mapping, case: str, setting: Setting) -> bool:
    """Whether every attack of the job (case, setting) runs L-BFGS on a model that a CPU
    core runs faster."""
    labels = plan.job_attacks(config, case, setting)
    return plan.find_case(config, case)["model"] in CPU_MODELS and all(
        registered(plan.attack_of(config, label)[0]).optimizer == "lbfgs" for label in labels)


def _placed(rule: str, on_gpu: bool, count: int, gpu_partition: str) -> dict:
    """Partition, memory and GPU request of a job that does (not) ask for a GPU (with
    ``FEDLEAK_SLURM_GPUS=0`` a GPU job runs on CPUs in the GPU partition)."""
    gpu = count if on_gpu else 0
    return {"slurm_partition": gpu_partition if on_gpu
            else os.environ.get("FEDLEAK_SLURM_PARTITION", "cpu"),
            "mem_mb": GPU_MEMORY_MB if gpu else MEMORY_MB.get(rule, DEFAULT_MEMORY_MB),
            "gpu": gpu, "cpus_per_gpu": 4 if gpu else 0,
            "gpu_model": os.environ.get("FEDLEAK_SLURM_GPU_MODEL", "") if gpu else ""}


def resources(rule: str, minutes=FIXED_MINUTES, *, config: Mapping) -> dict:
    """The SLURM resources of ``rule``: partition, GPUs, account, memory and wall time
    (``minutes``: a number, or a function of the job's wildcards). Where whether a job asks
    for a GPU depends on the job (FL runs and attribute jobs by their case's model, attack
    jobs by their attacks and model, studies by their kind), partition, memory and GPUs are
    functions of its wildcards, which Snakemake calls per job; a job without a GPU asks for
    ``gpu: 0``."""
    count = gpus()
    rate()  # every variable is checked before any job, whichever rule reads it
    gpu_partition = os.environ.get("FEDLEAK_SLURM_GPU_PARTITION", "gpu")
    if config["device"] == "cuda" and not (gpu_partition and count):
        raise ClusterError("device 'cuda' needs GPUs on the cluster, but "
                           + ("FEDLEAK_SLURM_GPU_PARTITION is empty" if not gpu_partition
                              else "FEDLEAK_SLURM_GPUS=0")
                           + "; expected a GPU partition and FEDLEAK_SLURM_GPUS >= 1, or "
                           "device 'auto' or 'cpu'")
    out: dict = {"runtime": minutes}
    if rule in ("study", "attack", *CASE_RULES) and config["device"] != "cpu" and gpu_partition:
        @functools.cache  # Snakemake asks once per resource of each job
        def placed_job(job: tuple[tuple[str, str], ...]) -> dict:
            return _placed(rule, gpu_job(config, rule, **dict(job)), count, gpu_partition)

        def placed(wildcards) -> dict:
            job = {"study": wildcards.name} if rule == "study" else {"case": wildcards.case}
            if rule == "attack":
                job["setting"] = wildcards.setting
            return placed_job(tuple(sorted(job.items())))
        out.update({key: (lambda wildcards, key=key: placed(wildcards)[key])
                    for key in _placed(rule, False, count, gpu_partition)})
    else:
        on_gpu = bool(gpu_partition) and gpu_job(config, rule)
        out.update({key: value for key, value in
                    _placed(rule, on_gpu, count, gpu_partition).items() if value not in (0, "")})
    if os.environ.get("FEDLEAK_SLURM_ACCOUNT"):
        out["slurm_account"] = os.environ["FEDLEAK_SLURM_ACCOUNT"]
    return out
