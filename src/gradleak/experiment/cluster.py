"""What each phase's jobs ask a cluster for: partition, GPU and account from the
environment, memory from the phase's declaration, wall time from its work.

The SLURM profile (workflow/profiles/slurm) only chooses the executor (workflow/profiles/
slurm-array: the same, with the plugin's job arrays for the rules with many small jobs);
the rules' resources come from here, so a user adapts the profile in one place, their
environment:

    GRADLEAK_SLURM_ACCOUNT        account for every job (unset: the plugin guesses it)
    GRADLEAK_SLURM_PARTITION      partition of the CPU jobs (default: cpu)
    GRADLEAK_SLURM_GPU_PARTITION  partition of the GPU jobs (default: gpu; empty: there is
                                 none, every job runs in the CPU partition)
    GRADLEAK_SLURM_GPUS           GPUs per GPU job (default: 1; 0 runs them on CPUs)
    GRADLEAK_SLURM_GPU_MODEL      GPU type, e.g. a100 (default: any)
    GRADLEAK_SLURM_RATE           attack iterations per second per victim that the wall time
                                 assumes (default: 5, ResNet-18 at 32x32 on one GPU, with
                                 a margin; raise it on fast GPUs, lower it on CPUs)

**Wall time.** A phase declared ``timed`` (FL runs, attack jobs) gets its work
(``Phase.work``, the units ``gradleak estimate`` prices) at assumed rates, doubled, plus 10
minutes of start-up: gradient-matching and L-BFGS iterations at ``GRADLEAK_SLURM_RATE``, FL
client steps at 20 per second. Every other phase gets a fixed allowance (data, networks,
priors, zoo, adversaries, aggregation: well under it on one GPU).

**Which jobs ask for a GPU** follows the configuration's ``device`` and each phase's
``gpu`` (``experiment.phase``): ``cpu``, none; ``cuda``, every job that runs on the device
(it would be refused on a node without one); ``auto``, the jobs whose phase says a GPU pays
for them (a phase's docstring says why; FL runs and attribute jobs by the case's model,
attack jobs unless all their attacks run L-BFGS on a LeNet, studies by their kind).
``GRADLEAK_SLURM_GPU_PARTITION=""`` sends the ``auto`` jobs to the CPU partition;
``device: cuda`` without a GPU partition or with ``GRADLEAK_SLURM_GPUS=0`` is refused
before any job. Outside SLURM these resources are ignored.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from pathlib import Path

from gradleak.experiment.phase import Identity, Phase, always, never, typed

GPU_MEMORY_MB = 16000
STARTUP_MINUTES = 10
FIXED_MINUTES = 120
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
    value = _env_number("GRADLEAK_SLURM_GPUS", 1)
    if value != int(value):
        raise ClusterError(f"GRADLEAK_SLURM_GPUS={value}: expected a whole number")
    return int(value)


def rate() -> float:
    value = _env_number("GRADLEAK_SLURM_RATE", 5)
    if value == 0:
        raise ClusterError("GRADLEAK_SLURM_RATE=0: expected a rate > 0")
    return value


def _seconds(unit: str) -> float:
    """Assumed seconds of one unit of work of a ``timed`` phase on the cluster. A defended
    upload (``defend``, ``defend_gradient``) counts 0: its cost is the defense's (from
    milliseconds to seconds a sample), which no assumed rate states; the doubled SGD steps
    are its margin. A unit with no assumed rate is an error, so that a new one is priced or
    said to count 0."""
    kind = unit.split(":")[0]
    assumed = {"match": 1 / rate(), "lbfgs": 1 / rate(), "fl_step": 1 / FL_STEPS_PER_SECOND,
               "defend": 0.0, "defend_gradient": 0.0}
    if kind not in assumed:
        raise ClusterError(f"no assumed cluster rate for the unit {unit!r}; expected a unit of "
                           f"{sorted(assumed)} (experiment/cluster.py: _seconds)")
    return assumed[kind]


def minutes(phase: Phase, config: Mapping, results: Path, identity: Identity) -> int:
    """Wall time of one job: its work at the assumed rates, doubled, plus the start-up, for
    a ``timed`` phase; else ``FIXED_MINUTES``."""
    if not phase.timed:
        return FIXED_MINUTES
    seconds = sum(count * _seconds(unit)
                  for unit, count in phase.work(config, results, identity).items())
    return STARTUP_MINUTES + math.ceil(2 * seconds / 60)


def gpu_job(phase: Phase, config: Mapping, results: Path, identity: Identity) -> bool:
    """Whether one job asks for a GPU under the configuration's ``device``."""
    if config["device"] == "cpu":
        return False
    wants = phase.gpu(config, results, identity)
    return wants is not None and (config["device"] == "cuda" or wants)


def _placed(phase: Phase, on_gpu: bool, count: int, gpu_partition: str) -> dict:
    """Partition, memory and GPU request of a job that does (not) ask for a GPU (with
    ``GRADLEAK_SLURM_GPUS=0`` a GPU job runs on CPUs in the GPU partition)."""
    gpu = count if on_gpu else 0
    return {"slurm_partition": gpu_partition if on_gpu
            else os.environ.get("GRADLEAK_SLURM_PARTITION", "cpu"),
            "mem_mb": GPU_MEMORY_MB if gpu else phase.memory_mb,
            "gpu": gpu, "cpus_per_gpu": 4 if gpu else 0,
            "gpu_model": os.environ.get("GRADLEAK_SLURM_GPU_MODEL", "") if gpu else ""}


def resources(phase: Phase, config: Mapping, results: Path | str = "results") -> dict:
    """The SLURM resources of ``phase``'s rule: partition, GPUs, account, memory and wall
    time. What depends on the job (a GPU by the job's model or attacks, a timed phase's
    wall time) is a function of its wildcards, which Snakemake calls per job; a job without
    a GPU asks for ``gpu: 0``."""
    count = gpus()
    rate()  # every variable is checked before any job, whichever rule reads it
    gpu_partition = os.environ.get("GRADLEAK_SLURM_GPU_PARTITION", "gpu")
    if config["device"] == "cuda" and not (gpu_partition and count):
        raise ClusterError("device 'cuda' needs GPUs on the cluster, but "
                           + ("GRADLEAK_SLURM_GPU_PARTITION is empty" if not gpu_partition
                              else "GRADLEAK_SLURM_GPUS=0")
                           + "; expected a GPU partition and GRADLEAK_SLURM_GPUS >= 1, or "
                           "device 'auto' or 'cpu'")

    @functools.cache  # Snakemake asks once per resource of each job
    def job(values: tuple) -> Identity:
        return typed(dict(values))

    def identity(wildcards) -> tuple:
        return tuple((w, getattr(wildcards, w)) for w in phase.wildcards)

    out: dict = {"runtime": (lambda wildcards: minutes(phase, config, Path(results),
                                                       job(identity(wildcards))))
                 if phase.timed else FIXED_MINUTES}
    if phase.gpu in (always, never) or config["device"] == "cpu" or not gpu_partition:
        on_gpu = config["device"] != "cpu" and bool(gpu_partition) and (
            phase.gpu is always or (config["device"] == "cuda" and phase.gpu is not never))
        out.update({k: v for k, v in _placed(phase, on_gpu, count, gpu_partition).items()
                    if v not in (0, "")})
    else:
        @functools.cache
        def placed(values: tuple) -> dict:
            return _placed(phase, gpu_job(phase, config, Path(results), job(values)), count,
                           gpu_partition)
        out.update({key: (lambda wildcards, key=key: placed(identity(wildcards))[key])
                    for key in _placed(phase, False, count, gpu_partition)})
    if os.environ.get("GRADLEAK_SLURM_ACCOUNT"):
        out["slurm_account"] = os.environ["GRADLEAK_SLURM_ACCOUNT"]
    return out
