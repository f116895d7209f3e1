"""What a pipeline phase is. Each phase is one module under ``experiment/phases/`` that
declares a :class:`Phase`: what its jobs produce and read, the configuration values they
read, the function a job calls, where it runs and what it costs. The Snakemake rules
(``workflow/rules/phases.smk``), ``gradleak <command>``, the SLURM resources
(``experiment/cluster.py``), ``dvc.yaml`` (``experiment/dvc.py``) and
``gradleak estimate`` are all made from these declarations.

A job's identity is a dict of its wildcards (``{"case": ..., "setting": Setting, "seed":
0}``), typed as :data:`WILDCARDS` reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradleak.experiment.plan import find_case
from gradleak.settings import Setting

Identity = dict[str, Any]
# A wildcard's Snakemake constraint and the type a job's identity holds it as.
WILDCARDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "dataset": ("[a-z0-9_]+", str),
    "case": ("[^/]+", str),
    "setting": ("[a-z][a-z0-9_]*-[^/]+", Setting.parse),
    "seed": (r"\d+", int),
    "round": (r"\d+", int),
    "name": ("[a-z][a-z0-9_]*", str),
}
# How a wildcard names its part of a log or benchmark path (the rest: its value).
PATH_PARTS = {"seed": "seed{seed}", "round": "round{round}"}
# what each kind of start-up runs after `import gradleak.cli` (`gradleak estimate` times it)
STARTUPS = {"startup": "",
            "startup:gradients": "import torch; from torch.func import grad, vmap; "
                                 "vmap(grad(lambda x: (x * x).sum()))(torch.ones(2, 3))",
            "startup:figures": "import matplotlib.pyplot, seaborn"}
# Models whose FL runs and attribute jobs stay on CPUs under `device: auto`: FedAvg LeNet
# took 8.58 s on a CPU and 4.15 s on an H200 (benchmarks/fl_device.py), a 2x that does not
# pay for a GPU against a CPU core, where ResNets gain far more.
CPU_MODELS = frozenset({"lenet"})


def typed(identity: Mapping[str, Any]) -> Identity:
    """A job's identity from wildcard values as text (Snakemake's) or already typed."""
    return {k: WILDCARDS[k][1](v) if isinstance(v, str) else v for k, v in identity.items()}


@dataclass(frozen=True)
class Output:
    """One output of a job: its path (with ``{wildcard}`` parts), whether it is a folder,
    and how ``snakemake --report`` shows it (a caption under workflow/report/)."""

    path: Path
    directory: bool = False
    caption: str | None = None
    category: str | None = None
    subcategory: str | None = None
    labels: Mapping[str, str] | None = None
    patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Kind:
    """An artifact kind that defenses or attacks declare as a ``Need`` (``needs.Need``; what
    it is: ``needs.ARTIFACTS``): the files a job waits for and the loader that builds the
    constructor argument from them, given the job (``experiment.job.Job``), the attacked
    model (None without one) and what it is of (``needs.artifact``: ``"gan:natural"`` is the
    prior of dataset ``natural``; None: the configuration's own)."""

    files: Callable[[Any, str | None], list[Path]]
    load: Callable[[Any, Any, str | None], Any]


def _nothing(*_args) -> list:
    return []


def _no_work(*_args) -> dict[str, int]:
    return {}


def never(_config: dict, _results: Path, _identity: Identity) -> None:
    """Never on the configured device (no model runs): no GPU under any ``device``."""
    return None


def always(_config: dict, _results: Path, _identity: Identity) -> bool:
    """On the configured device, asking for a GPU under ``device: auto`` too."""
    return True


def by_model(config: dict, _results: Path, identity: Identity) -> bool:
    """On the configured device; under ``auto`` a GPU unless the case's model is one a CPU
    core runs about as fast (``CPU_MODELS``)."""
    return find_case(config, identity["case"])["model"] not in CPU_MODELS


@dataclass(frozen=True)
class Phase:
    """One pipeline phase (one Snakemake rule, one ``gradleak`` command). Every hook of one
    job takes ``(config, results, identity)``; of the whole phase, ``(config, results,
    jobs)`` (``outputs``) or the configuration alone (``planned``).

    - ``wildcards``: a job's identity; ``run(config, results, **identity)`` is its job.
    - ``outputs(config, results, jobs)``: name -> :class:`Output` (or a list), ``{wildcard}``
      parts left in; ``jobs`` is the whole plan (``pipeline.walk``), which only a phase that
      ``gathers`` reads.
    - ``planned(config)``: the jobs the plan asks for directly; the rest of a phase's jobs
      are the ones that make files another job reads (``pipeline.walk``).
    - ``inputs(config, results, identity)``: the files a job reads besides its artifacts;
      ``artifacts(config, results, identity)``: the artifacts it loads (``needs.artifact``
      names), whose files it waits for and whose loaders' code it runs.
    - ``gathers``: phases whose every job's outputs a job reads (the aggregation).
    - ``reads``: the phases whose outputs its jobs may read, ``gathers`` among them: DVC's
      stage dependencies, one graph for every configuration, so declared rather than
      derived from one plan; ``pipeline.walk`` refuses a job that reads any other phase's
      outputs (docs/decisions/0108-reads-declared-and-enforced.md).
    - ``folders``: the folders (a name with a suffix: the file) under results/ it writes
      (DVC's outputs).
    - ``params(config, results, identity)``: the configuration values it reads (a change
      re-runs it).
    - ``gpu(config, results, identity)``: None when it never runs on the configured device, else
      whether it asks for a GPU under ``device: auto`` (``cuda``: every job on the device).
    - ``memory_mb``: the memory a CPU job asks for (a GPU job: ``cluster.GPU_MEMORY_MB``).
    - ``work(config, results, identity)``: units of work (``experiment.cost``) that
      ``gradleak estimate`` prices; with ``timed`` the cluster's wall time is counted from
      them too (else a fixed allowance).
    - ``startup``: what starting a job costs (``experiment.cost``: torch.func's first call
      for ``startup:gradients``, the plotting libraries for ``startup:figures``).
    - ``units``: the kinds of unit of work it introduces, each with the timer that
      ``gradleak estimate`` calibrates it by (a unit no phase declares is an error there,
      and one with no assumed rate in a ``timed`` phase an error on the cluster).
    - ``tables``: its jobs read the papers' numbers, which a configuration may keep in CSV
      files beside it (``reference.<target>.file``); DVC's stage depends on ``config/``.
    - ``resumable``: ``run`` takes ``resume`` (``experiment.resume.Resume``), where a job
      keeps its finished pieces, so that a killed job's rerun continues from them.
    - ``priority(config, results, identity)``: Snakemake starts ready jobs of a higher one
      first (the longest, so that no long job is left running alone at the end).
    """

    name: str
    summary: str
    wildcards: tuple[str, ...]
    folders: tuple[str, ...]
    reads: tuple[str, ...]
    outputs: Callable[[dict, Path, Mapping | None], dict[str, Output | list[Output]]]
    run: Callable[..., None]
    planned: Callable[[dict], list[Identity]] = _nothing
    inputs: Callable[[dict, Path, Identity], list[Path]] = _nothing
    artifacts: Callable[[dict, Path, Identity], list[str]] = _nothing
    gathers: tuple[str, ...] = ()
    params: Callable[[dict, Path, Identity], Any] = lambda config, results, identity: {}
    gpu: Callable[[dict, Path, Identity], bool | None] = never
    memory_mb: int = 4000
    timed: bool = False
    work: Callable[[dict, Path, Identity], dict[str, int]] = _no_work
    startup: str = "startup"
    priority: Callable[[dict, Path, Identity], int] = lambda config, results, identity: 0
    kinds: Mapping[str, Kind] = field(default_factory=dict)
    tables: bool = False
    resumable: bool = False
    # the units of work it introduces (``experiment.cost``), each with its timer:
    # (the unit's parts after its kind and before its batch, the batch, a torch device, a
    # seeded generator) -> one unit's work, ready to time (`gradleak estimate`)
    units: Mapping[str, Callable[..., Callable[[], object]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [w for w in self.wildcards if w not in WILDCARDS]
        if unknown or self.startup not in STARTUPS:
            raise ValueError(f"phase {self.name!r}: unknown wildcard {unknown} or start-up "
                             f"{self.startup!r}; expected wildcards of {sorted(WILDCARDS)} "
                             f"and a start-up of {sorted(STARTUPS)}")
        if not set(self.gathers) <= set(self.reads):
            raise ValueError(f"phase {self.name!r}: gathers {list(self.gathers)}; expected "
                             f"each in its reads {list(self.reads)}")

    @property
    def computes(self) -> bool:
        """Whether its jobs run a model (``config["threads"]`` torch threads each): the phases
        that may run on the device."""
        return self.gpu is not never

    @property
    def command(self) -> str:
        """Its ``gradleak`` command: the name with dashes (``fl_run`` -> ``fl-run``)."""
        return self.name.replace("_", "-")

    def path_parts(self) -> list[str]:
        """Its jobs' part of a log or benchmark path, with ``{wildcard}`` parts."""
        return [PATH_PARTS.get(w, f"{{{w}}}") for w in self.wildcards] or [self.name]
