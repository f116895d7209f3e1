"""`gradleak estimate`: the cost of each target before it runs (decision 0069).

The model is work x rate. The **work** of a job is its phase's ``work`` (units counted
from the configuration's budgets, ``experiment.cost`` lists them) and its start-up; the
jobs are the configuration's whole pipeline (``pipeline.walk``), each identified by its
first output, as Snakemake identifies it.

The **rates** are measured on the machine at hand by a short calibration that
``estimate`` runs itself (``calibrate``: each unit timed a few times after a warm-up, the
fastest, with ``threads`` torch threads as the jobs run), cached as JSON under
``$GRADLEAK_CACHE`` (default ``$XDG_CACHE_HOME/gradleak`` or ``~/.cache/gradleak``), one file
``estimate-<hostname>-torch<version>-<device>.json`` per machine, torch version and device;
a unit already in the cache is not measured again (delete the file to measure every unit
again, best on an otherwise idle machine). On the CPU a unit's seconds are CPU
seconds (``time.process_time``; the start-up's child process by ``getrusage``): CPU-hours,
which a dedicated core spends as wall time, and far less sensitive than wall time to other
processes sharing the machine (``benchmarks/estimate_check.py`` compares them with a run's
``results/benchmarks/``; docs/measurements.md has the numbers). On CUDA they are wall
seconds, the device synchronised. CPU hours use the CPU calibration; GPU hours the same
model calibrated on CUDA, only where CUDA is present (elsewhere they are left empty: no
factor turns a CPU's rates into a GPU's honestly; run ``gradleak estimate`` on the GPU
machine). An ``lbfgs`` unit is timed as the engine runs it, an iDLG attack of
``LBFGS_ITERATIONS`` iterations on one random victim from a random start, per iteration;
a ``defend`` unit as a client's upload through the setting's defense on at most
``DEFEND_BATCH`` random images, scaled to its batch; a ``defend_gradient`` unit (a defense
whose work reads the gradient alone) as one upload of its whole batch, unscaled.

A job that several targets need is counted in each of their rows and once in ``total``.
"""

from __future__ import annotations

import copy
import io
import json
import os
import platform
import resource
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from gradleak import attacks, defenses
from gradleak import config as cfg
from gradleak.experiment import cost, phases, pipeline, plan
from gradleak.experiment.phase import STARTUPS
from gradleak.experiment.studies.defense_cost import untrained_evalnet
from gradleak.types import Observation, Update
from gradleak.utils.device import to_device
from gradleak.utils.io import write_json
from gradleak.utils.threads import threads_within
from gradleak.utils.timing import timed

REPEATS = 5  # timed runs per unit after one warm-up; the fastest, the least disturbed, is kept
LBFGS_ITERATIONS = 100  # an ``lbfgs`` unit's timed attack (its early steps search longest)
# a ``defend`` unit is timed on at most this many images and scaled to its batch: the
# defenses' work is per sample (Soteria's Jacobian, Refiner's and CENSOR's batch passes), and
# Soteria's whole-batch Jacobian on a ResNet at batch 64 would need tens of GiB
DEFEND_BATCH = 8
RESULTS = Path("results")
COLUMNS = ("target", "jobs", "cpu_hours", "gpu_hours")
@dataclass
class Job:
    """One Snakemake job: its rule and the units of work it runs."""

    rule: str
    work: Counter = field(default_factory=Counter)


# -- jobs ---------------------------------------------------------------------------------

def jobs(config: dict, results: Path = RESULTS) -> dict[tuple[str, str], Job]:
    """Every job the configuration runs, by (rule, its first output), with its work."""
    found: dict[tuple[str, str], Job] = {}
    walked = pipeline.walk(config, results)
    for phase in phases.every():
        for identity in walked[phase.name]:
            first = pipeline.job_outputs(phase, config, results, identity, walked)[0]
            work = Counter({phase.startup: 1})
            work.update(phase.work(config, results, identity))
            found[(phase.name, str(first))] = Job(phase.name, work)
    return found


def _only(config: dict, names: list[str]) -> dict:
    """``config`` with ``names`` its only targets."""
    narrowed = copy.copy(config)
    narrowed["targets"] = {name: config["targets"][name] for name in names}
    return narrowed


def _check_targets(config: dict, names: list[str]) -> None:
    known = plan.targets(config)
    for name in names:
        if name not in known:
            raise cfg.ConfigError(f"unknown target {name!r}; expected one of {known}"
                                  if known else f"unknown target {name!r}: this "
                                  f"configuration has no targets (its one row is 'all')")


def plan_jobs(config: dict, targets: list[str] | None = None, results: Path = RESULTS
              ) -> dict[str, dict[tuple[str, str], Job]]:
    """Target -> the jobs Snakemake would run for it alone (``all`` for a configuration
    without targets), then ``total``: the jobs of all of them together, each once (an attack
    job that two targets share runs the union of their attacks). Every named target must be
    one of the configuration's (ConfigError listing them)."""
    _check_targets(config, targets or [])
    names = targets or plan.targets(config)
    if not names:
        found = jobs(config, results)
        return {"all": found, "total": found}
    rows = {name: jobs(_only(config, [name]), results) for name in names}
    rows["total"] = jobs(_only(config, names), results)
    return rows


# -- rates -------------------------------------------------------------------------------

def cache_file(device: str) -> Path:
    """Where the calibration of this machine, torch version and device is kept."""
    root = os.environ.get("GRADLEAK_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gradleak"
    return Path(root) / f"estimate-{platform.node()}-torch{torch.__version__}-{device}.json"


def _startup(kind: str) -> Callable[[], object]:
    command = [sys.executable, "-c", f"import gradleak.cli; {STARTUPS[kind]}"]
    return lambda: subprocess.run(command, check=True, capture_output=True)


def _figure() -> Callable[[], object]:
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame({"x": [x for x in range(8) for _ in range(3)],
                          "y": [(x * 7 + h) % 5 for x in range(8) for h in range(3)],
                          "series": [f"s{h}" for _ in range(8) for h in range(3)]})

    def draw() -> None:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        sns.lineplot(frame, x="x", y="y", hue="series", style="series", markers=True, ax=ax)
        fig.savefig(io.BytesIO(), format="png", dpi=150, bbox_inches="tight")
        plt.close(fig)
    return draw


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _seconds(call: Callable[[], object], device: str) -> float:
    """One timed run of ``call``: CPU seconds on the CPU, wall seconds on CUDA."""
    if device != "cpu":
        return timed(call, device)[0]
    before = _cpu_seconds()
    call()
    return _cpu_seconds() - before


def _gradient_step(parts: list[str], batch: int, device: torch.device,
                   gen: torch.Generator) -> Callable[[], object]:
    """One client's SGD step of the unit's model on random images (``fl_step``)."""
    model, shape, classes = cost.model_of(parts, device)
    x = torch.rand((batch, *shape), generator=gen).to(device)
    y = torch.randint(classes, (batch,), generator=gen).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.0)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _matching_step(parts: list[str], batch: int, device: torch.device,
                   gen: torch.Generator) -> Callable[[], object]:
    """One gradient-matching iteration of a dummy batch against a target gradient
    (``match``)."""
    model, shape, classes = cost.model_of(parts, device)
    x = torch.rand((batch, *shape), generator=gen).to(device)
    y = torch.randint(classes, (batch,), generator=gen).to(device)
    loss = torch.nn.functional.cross_entropy
    params = [p for p in model.parameters() if p.requires_grad]
    target = [g.detach() for g in torch.autograd.grad(loss(model(x), y), params)]
    dummy = torch.rand((batch, *shape), generator=gen).to(device).requires_grad_()

    def match() -> None:
        grads = torch.autograd.grad(loss(model(dummy), y), params, create_graph=True)
        distance = sum(((g - t) ** 2).sum() for g, t in zip(grads, target))
        distance.backward()
    return match


def timers() -> dict[str, Callable[..., Callable[[], object]]]:
    """Every unit kind's timer: the ones several phases count (start-ups, a figure, an FL
    step, a matching or L-BFGS iteration, a defended upload) and each phase's own
    (``Phase.units``)."""
    own = {kind: timer for phase in phases.every() for kind, timer in phase.units.items()}
    return {"startup": lambda parts, batch, device, gen: _startup(":".join(["startup", *parts])),
            "figure": lambda parts, batch, device, gen: _figure(),
            "fl_step": _gradient_step, "match": _matching_step, "lbfgs": _lbfgs_attack,
            "defend": _defended_upload,
            "defend_gradient": lambda parts, batch, device, gen: _defended_upload(
                parts, batch, device, gen, cap=None),
            **own}


def _unit_call(unit: str, device: torch.device) -> Callable[[], object]:
    """One unit of work, ready to time (its inputs built once, on ``device``)."""
    kind, *parts = unit.split(":")
    known = timers()
    if kind not in known:
        raise ValueError(f"unknown unit of work {unit!r}; expected one of the kinds "
                         f"{sorted(known)} (a phase declares its own in `units`)")
    batch = None  # the last part, b<batch>, where the unit has one
    if parts and parts[-1].startswith("b") and parts[-1][1:].isdigit():
        batch = int(parts.pop()[1:])
    return known[kind](parts, batch, device, torch.Generator().manual_seed(0))


def _lbfgs_attack(parts: list[str], batch: int, device: torch.device,
                  gen: torch.Generator) -> Callable[[], object]:
    """iDLG on one victim of random images, ``LBFGS_ITERATIONS`` iterations (DLG, labels
    optimised too, for a batch of several: iDLG reads one label)."""
    model, shape, classes = cost.model_of(parts, device)
    x = torch.rand((batch, *shape), generator=gen).to(device)
    y = torch.randint(classes, (batch,), generator=gen).to(device)
    context = defenses.DefenseContext(model=model, x=x, y=y, generator=gen)
    observed = Observation(model=model, gradient=defenses.build_at("none", 0.0)(context),
                           batch_size=batch)
    attack = attacks.build("idlg" if batch == 1 else "dlg", iterations=LBFGS_ITERATIONS)
    return lambda: attack(observed)


def _defended_upload(parts: list[str], batch: int, device: torch.device,
                     gen: torch.Generator, cap: int | None = DEFEND_BATCH
                     ) -> Callable[[], object]:
    """One upload of random images (at most ``cap``) through the unit's defense, given the
    batch's gradient (the ``fl_step`` unit's work), its artifacts stood in for
    (``experiment.cost``: their weights do not change the cost)."""
    spec = cost.defense_spec(parts[0])
    model, shape, classes = cost.model_of(parts[1:], device)
    batch = batch if cap is None else min(batch, cap)
    x = torch.rand((batch, *shape), generator=gen).to(device)
    y = torch.randint(classes, (batch,), generator=gen).to(device)
    stand_ins = {"evalnet": lambda: untrained_evalnet(shape, spec["evalnet_widths"],
                                                     spec["defense"]),
                 "public_data": lambda: _public_images(shape, classes, 4 * batch,
                                                       spec["params"].get("public_class"), gen)}
    loaded = {arg: stand_ins[kind]() for arg, kind in spec["needs"].items()}
    defense = defenses.build(spec["defense"], **spec["params"], **to_device(loaded, device))
    # the client's gradient is the fl_step unit's work: the defense gets it computed
    gradient = Update.of(model, x, y).detached()
    return lambda: defense(defenses.DefenseContext(model, x, y, torch.Generator().manual_seed(0),
                                                   gradient=gradient))


def _public_images(shape: tuple, classes: int, count: int, only: int | None,
                   gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random labelled public images for CENSOR's proposals (all of class ``only`` when its
    ``public_class`` keeps one)."""
    labels = (torch.full((count,), only) if only is not None
              else torch.randint(classes, (count,), generator=gen))
    return torch.rand((count, *shape), generator=gen), labels


def _timed_share(unit: str) -> float:
    """How many units one timed call runs: an ``lbfgs`` unit's iterations, a ``defend``
    unit's share of its batch, a phase's timer's ``share`` where it declares one (else 1)."""
    if unit.startswith("lbfgs:"):
        return LBFGS_ITERATIONS
    if unit.startswith("defend:"):
        batch = int(unit.rsplit(":b", 1)[1])
        return min(batch, DEFEND_BATCH) / batch
    return getattr(timers().get(unit.split(":", 1)[0]), "share", 1)


def calibrate(units: Iterable[str], device: str = "cpu", threads: int | None = None,
              refresh: bool = False) -> dict[str, float]:
    """Seconds per unit on ``device``, from the cache where it has them; the others are
    measured (a warm-up, then the fastest of ``REPEATS`` runs: other work on the machine
    only ever slows a run) and added to the cache."""
    path = cache_file(device)
    cached: dict[str, float] = {}
    if path.is_file() and not refresh:
        cached = json.loads(path.read_text())
    missing = sorted(set(units) - set(cached))
    if missing:
        with threads_within(threads or None):
            for unit in tqdm(missing, desc=f"calibrating on {device}", unit="unit",
                             file=sys.stderr):
                call = _unit_call(unit, torch.device(device))
                call()  # warm-up: lazy initialisation, allocator growth
                cached[unit] = min(_seconds(call, device)
                                   for _ in range(REPEATS)) / _timed_share(unit)
                write_json(path, dict(sorted(cached.items())))  # kept if stopped midway
    return cached


# -- the estimate ------------------------------------------------------------------------

def job_hours(work: Counter, rates: dict[str, float] | None) -> float | None:
    """Hours of ``work`` at ``rates`` (seconds per unit); None without rates."""
    if rates is None:
        return None
    return sum(count * rates[unit] for unit, count in work.items()) / 3600


def estimate(config: dict, targets: list[str] | None = None, results: Path = RESULTS,
             devices: tuple[str, ...] | None = None) -> list[dict]:
    """One row per target and a ``total`` row: jobs, cpu_hours, gpu_hours (None without a
    CUDA calibration). Jobs shared by targets count once in the total."""
    rows_jobs = plan_jobs(config, targets, results)
    units = {unit for found in rows_jobs.values() for job in found.values() for unit in job.work}
    if devices is None:
        devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    rates = {d: calibrate(units, d, config["threads"]) for d in devices}
    rows = []
    for name, found in rows_jobs.items():
        work = sum((job.work for job in found.values()), Counter())
        rows.append({"target": name, "jobs": len(found),
                     "cpu_hours": job_hours(work, rates.get("cpu")),
                     "gpu_hours": job_hours(work, rates.get("cuda")),
                     "rules": Counter(job.rule for job in found.values())})
    return rows


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def csv_text(rows: list[dict]) -> str:
    lines = [",".join(COLUMNS)]
    lines += [",".join([row["target"], str(row["jobs"]), _number(row["cpu_hours"]),
                        _number(row["gpu_hours"])]) for row in rows]
    return "\n".join(lines) + "\n"


def text(rows: list[dict]) -> str:
    width = max(len(row["target"]) for row in rows)
    lines = []
    for row in rows:
        rules = ", ".join(f"{count} {rule}" for rule, count in sorted(row["rules"].items()))
        gpu = "-" if row["gpu_hours"] is None else f"{row['gpu_hours']:.3g}"
        lines.append(f"{row['target']:<{width}}  {row['jobs']:>5} jobs  "
                     f"{row['cpu_hours']:>9.3g} CPU-h  {gpu:>9} GPU-h  ({rules})")
    lines.append("a job that several targets need is in each of their rows and once in "
                 "'total'")
    if rows[-1]["gpu_hours"] is None:
        lines.append("GPU-h: no CUDA device here; run `gradleak estimate` on the GPU machine")
    return "\n".join(lines) + "\n"
