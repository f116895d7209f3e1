"""`fedleak estimate`: the cost of each target before it runs (issue 32).

The model is work x rate. The **work** of a job is counted from the configuration's budgets,
in units whose cost depends only on the model, the input shape and the batch size:

- ``fl_step``: one client's local SGD step (forward, backward, step) of the case's model at
  ``fl.client_batch_size``; an FL run is rounds x round(participation x clients) x
  ``fl.local_steps`` of them (per FL seed).
- ``match``: one gradient-matching iteration of an optimisation attack (the model's gradient
  of a dummy batch of ``attack.batch_size`` with ``create_graph``, its L2 distance to a
  target gradient, the backward pass to the dummy input): per attack label, victims x
  restarts x iterations (GIAS/GIML: the iterations of each stage of the variant; GIFD: the
  sum of its ``steps``; EOT: samples x the wrapped attack's; R-GAP: its latent search, else
  one), x the uploads of a sequence victim. The generator's forward pass of the GAN-based
  attacks is not in it.
- ``lbfgs``: one iteration of an L-BFGS attack (DLG, iDLG and EPAFL's stopped iDLG), counted
  as ``match`` is: one L-BFGS step evaluates the objective up to 20 times (its line
  search) and the loop checks and copies the iterate after each, so its cost is timed as
  the engine runs it, an iDLG attack of ``LBFGS_ITERATIONS`` iterations on one random victim
  from a random start, per iteration.
- ``gan_step`` / ``evalnet_step``: one training step of the DCGAN prior / Refiner's
  evaluation network at its batch size (the library trainers, one batch, one epoch); a
  training job is epochs x ceil(split images / batch) of them, the split's size from the
  prepared data's manifest or else ``config.split_capacity``.
- GIML's generator: outer steps x tasks x (latent + parameter iterations) ``match``es at
  ``giml.batch_size``. RecUP-FL's zoo: the per-sample gradients (``fl_step`` at batch 1)
  of its train samples, then ``zoo_size`` x attributes x ``zoo_epochs`` x batches of
  ``mlp_step`` (one SGD step of a defender MLP, three hidden layers of 512, the middle of
  the widths it draws); the adversaries and attribute jobs: the per-sample gradients of
  their train and test samples, with ``attribute.adaptive`` the train samples' defended
  uploads again (the adversaries' own fitting is not in it).
- ``startup``: starting ``python`` and importing ``fedleak.cli``, once per job (Snakemake
  runs each job in its own process); ``startup:gradients`` also pays torch.func's first
  call (it imports torch's compiler stack, ~1-3 CPU s), as the attack engine, GIML and the
  adversaries' per-sample gradients do (``GRADIENT_RULES``); ``startup:figures`` imports
  matplotlib and seaborn, as ``target`` and ``aggregate`` do. Data preparation and studies
  are counted as start-up alone.
- ``figure``: drawing and saving one figure (a seaborn line plot at the project's dpi):
  each figure a target draws (its panels) and each standard figure of the aggregation.
  A job's data loading, metrics and file writing are not in the model.

The **rates** are measured on the machine at hand by a short calibration that
``estimate`` runs itself (``calibrate``: each unit timed a few times after a warm-up, the
median, with ``threads`` torch threads as the jobs run), cached as JSON under
``$FEDLEAK_CACHE`` (default ``$XDG_CACHE_HOME/fedleak`` or ``~/.cache/fedleak``), one file
``estimate-<hostname>-torch<version>-<device>.json`` per machine, torch version and device;
a unit already in the cache is not measured again. On the CPU a unit's seconds are CPU
seconds (``time.process_time``; the start-up's child process by ``getrusage``): CPU-hours,
which a dedicated core spends as wall time, and far less sensitive than wall time to other
processes sharing the machine (``benchmarks/estimate_check.py`` compares them with a run's
``results/benchmarks/``; docs/decisions.md has the numbers). On CUDA they are wall seconds,
the device synchronised. CPU hours use the CPU calibration; GPU
hours the same model calibrated on CUDA, only where CUDA is present (elsewhere they are
left empty: no factor turns a CPU's rates into a GPU's honestly; run ``fedleak estimate`` on
the GPU machine).

A job is identified by its output file, as Snakemake identifies it: a job that several
targets need is counted in each of their rows and once in ``total``.
``cluster.attack_minutes`` and ``cluster.fl_minutes`` count their work with
``attack_work`` and ``fl_steps`` from here.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from fedleak import attacks, data, defenses, models
from fedleak import config as cfg
from fedleak.adversaries.neural import make_net
from fedleak.experiment import paths, phases, plan
from fedleak.types import Observation
from fedleak.utils.io import write_json
from fedleak.utils.timing import timed

REPEATS = 3  # timed runs per unit after one warm-up; the median is kept
LBFGS_ITERATIONS = 100  # an ``lbfgs`` unit's timed attack (its early steps search longest)
RESULTS = Path("results")
COLUMNS = ("target", "jobs", "cpu_hours", "gpu_hours")
ZOO_BATCH, ZOO_WIDTH = 32, 512  # adversaries.train_zoo's batch; the middle of its widths
# the rules whose jobs call torch.func (the attack engine, GIML, per-sample gradients)
GRADIENT_RULES = frozenset({"attack", "train_giml", "train_zoo", "fit_adversaries",
                            "attribute"})
FIGURE_RULES = frozenset({"target", "aggregate"})  # they draw with matplotlib and seaborn
# what a start-up of each kind runs after `import fedleak.cli`
STARTUP = {"startup": "",
           "startup:gradients": "import torch; from torch.func import grad, vmap; "
                                "vmap(grad(lambda x: (x * x).sum()))(torch.ones(2, 3))",
           "startup:figures": "import matplotlib.pyplot, seaborn"}


@dataclass
class Job:
    """One Snakemake job: its rule and the units of work it runs."""

    rule: str
    work: Counter = field(default_factory=Counter)


# -- work --------------------------------------------------------------------------------

def fl_steps(config: dict, clients: int) -> int:
    """Local steps of one FL run: rounds x clients per round x local steps."""
    fl = config["fl"]
    return fl["rounds"] * max(1, round(fl["participation"] * clients)) * fl["local_steps"]


def attack_iterations(name: str, params: dict) -> int:
    """Gradient-matching iterations of one restart of one victim of attack ``name``: the
    attack class's ``budget`` of its parameters with the schema's defaults."""
    return attacks.base.registered(name).budget(cfg.resolve("attacks", name, params))


def attack_work(config: dict, labels: Iterable[str], deterministic: bool = False) -> Counter:
    """Gradient-matching iterations of one attack job (one seed), by the optimiser that runs
    them (``adam`` or ``lbfgs``): per label, victims x restarts x iterations, x the uploads
    of a sequence victim; a label in ``attack.adaptive`` once more for its adaptive
    attacker, x ``attack.adaptive_samples`` draws of the defense (one of a
    ``deterministic`` one; unknown: the most it can cost)."""
    uploads = max(1, config["attack"]["sequence"]["steps"])
    draws = 1 if deterministic else config["attack"]["adaptive_samples"]
    work: Counter = Counter()
    for label in labels:
        name, params = plan.attack_of(config, label)
        restarts = cfg.resolve("attacks", name, params).get("restarts", 1)
        runs = 1 + (draws if label in config["attack"]["adaptive"] else 0)
        work[attacks.base.registered(name).optimizer] += plan.victims(config, label) \
            * restarts * attack_iterations(name, params) * uploads * runs
    return work


def _shape(config: dict, results: Path, dataset: str) -> tuple[tuple[int, int, int], int]:
    """(C, H, W) and classes of a dataset: from its prepared manifest, else its options."""
    manifest = paths.data_manifest(results, dataset)
    if manifest.is_file():
        found = json.loads(manifest.read_text())
        return tuple(found["shape"]), found["num_classes"]
    spec = config["datasets"].get(dataset, {})
    if dataset in ("digits", "natural"):
        return (spec.get("channels", 1), spec.get("size", 32), spec.get("size", 32)), 10
    c, h, w, classes = data.datasets.SHAPES[dataset]
    if dataset in data.datasets.IMAGE_FOLDERS:
        h = w = spec.get("size", h)
    return (c, h, w), classes


def _split_size(config: dict, results: Path, dataset: str, split: str) -> int:
    manifest = paths.data_manifest(results, dataset)
    if manifest.is_file():
        return json.loads(manifest.read_text())["splits"][split]["count"]
    return cfg.split_capacity(config, dataset, split) or data.datasets.STAND_IN_SIZE


def _model_unit(config: dict, results: Path, case: str, kind: str, batch: int) -> str:
    spec = plan.find_case(config, case)
    (c, h, w), classes = _shape(config, results, spec["dataset"])
    option = {"lenet": spec.get("uniform_init"), "attribute_cnn": spec.get("layout")}.get(
        spec["model"])  # the constructor option that changes the network
    return f"{kind}:{spec['model']}:{c}x{h}x{w}:{classes}:{'' if option is None else option}" \
           f":b{batch}"


def jobs(config: dict, results: Path = RESULTS) -> dict[tuple[str, str], Job]:
    """Every job the configuration runs, by (rule, output), with its work."""
    out = phases.outputs(config, results)
    found: dict[tuple[str, str], Job] = {}

    def add(rule: str, key: Path | str, work: dict | None = None) -> None:
        job = found.setdefault((rule, str(key)), Job(rule))
        startup = "startup:gradients" if rule in GRADIENT_RULES else \
            "startup:figures" if rule in FIGURE_RULES else "startup"
        job.work.update({startup: 1, **(work or {})})

    for path in out["data"]:
        add("prepare_data", path)
    for path in out["evalnet"]:
        dataset, spec = path.stem, config["evalnet"]
        size = _split_size(config, results, spec["dataset"], "train")
        (c, h, w), _ = _shape(config, results, dataset)
        add("train_evalnet", path, {f"evalnet_step:{c}x{h}x{w}:{spec['widths']}"
                                    f":b{spec['batch_size']}":
                                    spec["epochs"] * math.ceil(size / spec["batch_size"])})
    for path in out["gan"]:
        spec = config["gan"]
        dataset = path.stem
        size = _split_size(config, results, dataset, spec["split"])
        (c, _, _), _ = _shape(config, results, dataset)
        size_tag = "" if spec["resolution"] == 32 else f":r{spec['resolution']}"  # 64x64
        add("train_gan", path, {f"gan_step:{c}:{spec['latent_dim']}:{spec['width']}"
                                f"{size_tag}:b{spec['batch_size']}":
                                spec["epochs"] * math.ceil(size / spec["batch_size"])})
    for path in out["giml"]:
        spec, case = config["giml"], path.stem
        iterations = spec["latent_iterations"] + spec["parameter_iterations"]
        add("train_giml", path, {_model_unit(config, results, case, "match", spec["batch_size"]):
                                 spec["outer_steps"] * spec["tasks_per_step"] * iterations})
    for case, setting in plan.fl_jobs(config):
        resolved = plan.resolve(config, setting)
        clients = plan.find_case(config, case)["partition"]["clients"]
        unit = _model_unit(config, results, case, "fl_step", resolved["fl"]["client_batch_size"])
        for seed in config["fl"]["seeds"]:
            add("fl_run", paths.fl_metrics(results, case, setting, seed),
                {unit: fl_steps(resolved, clients)})
    for (case, setting), labels in plan.attack_jobs(config).items():
        resolved = plan.resolve(config, setting)
        batch = resolved["attack"]["batch_size"]
        deterministic = defenses.registered(plan.defense_of(config, setting)[0]).deterministic
        work = {_model_unit(config, results, case, "lbfgs" if optimizer == "lbfgs" else "match",
                            batch): iterations
                for optimizer, iterations in attack_work(resolved, labels,
                                                         deterministic).items()}
        for seed in config["attack"]["seeds"]:
            add("attack", paths.attack_metrics(results, case, setting, seed), work)
    spec = config["attribute"]
    samples = spec["train_samples"] + spec["test_samples"]
    for path in out["zoo"]:
        case = path.parent.parent.name
        steps = spec["zoo_size"] * len(plan.zoo_attributes(config, case)) * spec["zoo_epochs"] \
            * math.ceil(spec["train_samples"] / ZOO_BATCH)
        add("train_zoo", path, {_model_unit(config, results, case, "fl_step", 1):
                                spec["train_samples"],
                                f"mlp_step:{spec['feature_size']}:b{ZOO_BATCH}": steps})
    for case, setting, round_ in plan.adversary_jobs(config):
        for seed in config["fl"]["seeds"]:
            add("fit_adversaries", paths.adversaries_file(results, case, setting, seed, round_),
                {_model_unit(config, results, case, "fl_step", 1): samples})
    for case, setting in plan.attribute_jobs(config):
        resolved = plan.resolve(config, setting)["attribute"]
        # attribute.adaptive: D_train's defended uploads too, for the adaptive adversaries
        uploads = samples + resolved["train_samples"] * resolved["adaptive"]
        for seed in config["fl"]["seeds"]:
            add("attribute", paths.attribute_metrics(results, case, setting, seed),
                {_model_unit(config, results, case, "fl_step", 1):
                 uploads * len(resolved["rounds"])})
    for path in out["studies"]:
        add("study", path)
    for name, path in zip(plan.targets(config), out["targets"]):
        add("target", path, {"figure": len(cfg.figure_specs(config["targets"][name]))})
    add("aggregate", paths.report(results), {"figure": len(out["figures"])})  # report.md
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
    root = os.environ.get("FEDLEAK_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedleak"
    return Path(root) / f"estimate-{platform.node()}-torch{torch.__version__}-{device}.json"


def _startup(kind: str) -> Callable[[], object]:
    command = [sys.executable, "-c", f"import fedleak.cli; {STARTUP[kind]}"]
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


def _model(parts: list[str], device: torch.device) -> tuple[torch.nn.Module, tuple, int]:
    name, shape, classes, option = parts
    c, h, w = (int(v) for v in shape.split("x"))
    options = {}
    if name == "lenet" and option:
        options["uniform_init"] = option == "True"
    if name == "attribute_cnn" and option:
        options["layout"] = option
    model = models.build(name, c, int(classes), h, input_shape=(c, h, w), **options)
    return model.to(device), (c, h, w), int(classes)


def _unit_call(unit: str, device: torch.device) -> Callable[[], object]:
    """One unit of work, ready to time (its inputs built once, on ``device``)."""
    kind, *parts = unit.split(":")
    if kind == "startup":
        return _startup(unit)
    if kind == "figure":
        return _figure()
    batch = int(parts[-1].removeprefix("b"))
    gen = torch.Generator().manual_seed(0)
    if kind == "lbfgs":
        return _lbfgs_attack(parts[:-1], batch, device, gen)
    if kind in ("fl_step", "match"):
        model, shape, classes = _model(parts[:-1], device)
        x = torch.rand((batch, *shape), generator=gen).to(device)
        y = torch.randint(classes, (batch,), generator=gen).to(device)
        loss = torch.nn.functional.cross_entropy
        params = [p for p in model.parameters() if p.requires_grad]
        if kind == "fl_step":
            opt = torch.optim.SGD(params, lr=0.0)

            def step() -> None:
                opt.zero_grad()
                loss(model(x), y).backward()
                opt.step()
            return step
        target = [g.detach() for g in torch.autograd.grad(loss(model(x), y), params)]
        dummy = torch.rand((batch, *shape), generator=gen).to(device).requires_grad_()

        def match() -> None:
            grads = torch.autograd.grad(loss(model(dummy), y), params, create_graph=True)
            distance = sum(((g - t) ** 2).sum() for g, t in zip(grads, target))
            distance.backward()
        return match
    if kind == "mlp_step":
        net = make_net(int(parts[0]), [ZOO_WIDTH] * 3, 2, 0).to(device)
        x = torch.rand((batch, int(parts[0])), generator=gen).to(device)
        y = torch.randint(2, (batch,), generator=gen).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.0, momentum=0.9)

        def mlp_step() -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return mlp_step
    if kind == "gan_step":
        channels, latent, width = (int(v) for v in parts[:3])
        size = int(parts[3].removeprefix("r")) if len(parts) == 5 else 32
        images = torch.rand((batch, channels, size, size), generator=gen).to(device)
        return lambda: models.dcgan.train_dcgan(images, epochs=1, batch_size=batch, lr=2e-4,
                                                latent_dim=latent, width=width, seed=0,
                                                progress=False)
    if kind == "evalnet_step":
        c, h, w = (int(v) for v in parts[0].split("x"))
        widths = tuple(int(v) for v in parts[1].strip("[]").split(","))
        images = torch.rand((batch, c, h, w), generator=gen).to(device)
        return lambda: models.evalnet.train_evaluation_network(
            images, epochs=1, batch_size=batch, lr=1e-4, seed=0, widths=widths, progress=False)
    raise ValueError(f"unknown unit of work {unit!r}")


def _lbfgs_attack(parts: list[str], batch: int, device: torch.device,
                  gen: torch.Generator) -> Callable[[], object]:
    """iDLG on one victim of random images, ``LBFGS_ITERATIONS`` iterations."""
    model, shape, classes = _model(parts, device)
    x = torch.rand((batch, *shape), generator=gen).to(device)
    y = torch.randint(classes, (batch,), generator=gen).to(device)
    context = defenses.DefenseContext(model=model, x=x, y=y, generator=gen)
    observed = Observation(model=model, gradient=defenses.build_at("none", 0.0)(context),
                           batch_size=batch)
    attack = attacks.build("idlg", iterations=LBFGS_ITERATIONS)
    return lambda: attack(observed)


def calibrate(units: Iterable[str], device: str = "cpu", threads: int | None = None,
              refresh: bool = False) -> dict[str, float]:
    """Seconds per unit on ``device``, from the cache where it has them; the others are
    measured (a warm-up, then the median of ``REPEATS`` runs) and added to the cache."""
    path = cache_file(device)
    cached: dict[str, float] = {}
    if path.is_file() and not refresh:
        cached = json.loads(path.read_text())
    missing = sorted(set(units) - set(cached))
    if missing:
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            for unit in tqdm(missing, desc=f"calibrating on {device}", unit="unit",
                             file=sys.stderr):
                call = _unit_call(unit, torch.device(device))
                call()  # warm-up: lazy initialisation, allocator growth
                per = LBFGS_ITERATIONS if unit.startswith("lbfgs:") else 1
                cached[unit] = statistics.median(_seconds(call, device)
                                                 for _ in range(REPEATS)) / per
        finally:
            torch.set_num_threads(before)
        write_json(path, dict(sorted(cached.items())))
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
        lines.append("GPU-h: no CUDA device here; run `fedleak estimate` on the GPU machine")
    return "\n".join(lines) + "\n"
