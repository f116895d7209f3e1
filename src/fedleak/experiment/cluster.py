"""What each rule asks a cluster for: partition, GPU and account from the environment, wall
time from the configuration's budgets.

The SLURM profile (workflow/profiles/slurm) only chooses the executor; the rules' resources
come from here, so a user adapts the profile in one place, their environment:

    FEDLEAK_SLURM_ACCOUNT        account for every job (unset: the plugin guesses it)
    FEDLEAK_SLURM_PARTITION      partition of the CPU rules (default: cpu)
    FEDLEAK_SLURM_GPU_PARTITION  partition of the GPU rules (default: gpu)
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
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping

from fedleak.experiment import estimate

GPU_RULES = frozenset({"train_evalnet", "train_gan", "attack", "study"})  # study: defense cost
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
    work = estimate.attack_work(config, labels)
    return STARTUP_MINUTES + math.ceil(2 * work / rate() / 60)


def fl_minutes(config: Mapping, clients: int) -> int:
    steps = estimate.fl_steps(config, clients)
    return STARTUP_MINUTES + math.ceil(2 * steps / FL_STEPS_PER_SECOND / 60)


def resources(rule: str, minutes=FIXED_MINUTES) -> dict:
    """The SLURM resources of ``rule``: partition, GPUs, account, memory and wall time
    (``minutes``: a number, or a function of the job's wildcards)."""
    count = gpus()
    rate()  # every variable is checked before any job, whichever rule reads it
    gpu_job = rule in GPU_RULES and count > 0
    out = {"mem_mb": GPU_MEMORY_MB if gpu_job else MEMORY_MB.get(rule, DEFAULT_MEMORY_MB),
           "runtime": minutes}
    if rule in GPU_RULES:
        out["slurm_partition"] = os.environ.get("FEDLEAK_SLURM_GPU_PARTITION", "gpu")
    else:
        out["slurm_partition"] = os.environ.get("FEDLEAK_SLURM_PARTITION", "cpu")
    if gpu_job:
        out["gpu"] = count
        out["cpus_per_gpu"] = 4
        if os.environ.get("FEDLEAK_SLURM_GPU_MODEL"):
            out["gpu_model"] = os.environ["FEDLEAK_SLURM_GPU_MODEL"]
    if os.environ.get("FEDLEAK_SLURM_ACCOUNT"):
        out["slurm_account"] = os.environ["FEDLEAK_SLURM_ACCOUNT"]
    return out
