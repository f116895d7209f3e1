"""Phase ``attack``: one job per (case, setting, seed) runs the job's attack labels, each
against the same defended uploads of its victims (``experiment.victims``), with the
adaptive attacker of a label in ``attack.attacker.adaptive`` (EOT through the setting's defense,
decision 0072) on the same victims; metrics per victim (``experiment.records``).

Declares the artifacts only attacks load: the generator prior (``gan``: the pipeline's
DCGAN of a dataset, or the pretrained ``gan.weights``), its untrained architecture
(``untrained_gan``), the BatchNorm statistics of public images (``bn_proxy``) and the
setting's defense itself (``defense``, which an adaptive attack samples).
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

from gradleak import attacks, data, defenses, metrics, models
from gradleak import config as cfg
from gradleak.attacks.bn_statistics import dataset_statistics
from gradleak.data.victims import problem
from gradleak.experiment import artifacts, cost, paths, plan, priors, records, victims
from gradleak.experiment.job import Job, model_at
from gradleak.experiment.phase import CPU_MODELS, Kind, Output, Phase
from gradleak.experiment.phases.prepare_data import class_counts
from gradleak.experiment.resume import Resume
from gradleak.settings import ADAPTIVE, PAPER, Setting
from gradleak.utils.device import select
from gradleak.utils.io import write_json
from gradleak.utils.seeding import child_seeds, seed_everything

# -- the artifacts only attacks load ----------------------------------------------------

def prior_dataset(job: Job, of: str | None) -> str:
    """The dataset a GAN prior is of: an attack's ``prior_dataset``; else the case's dataset
    where ``gan.by_dataset`` gives it a pretrained prior of its own; else ``gan.dataset``."""
    if of:
        return of
    return job.dataset if job.dataset in priors.pretrained_datasets(job.config) \
        else job.config["gan"]["dataset"]


def _pretrained(job: Job, of: str | None) -> bool:
    return prior_dataset(job, of) in priors.pretrained_datasets(job.config)


def _gan(job: Job, of: str | None) -> Path:
    """The prior's file: a pretrained prior's weights file, or the pipeline's DCGAN of the
    dataset."""
    if _pretrained(job, of):
        return priors.weights(job.config, prior_dataset(job, of))
    return paths.gan_file(job.results, prior_dataset(job, of))


def _load_gan(job: Job, of: str | None) -> torch.nn.Module:
    if _pretrained(job, of):
        return priors.load(job.config, prior_dataset(job, of))
    return models.dcgan.load_generator(_gan(job, of))


def _untrained_files(job: Job, of: str | None) -> list[Path]:
    """A DCGAN's channels are its dataset's (its manifest); a pretrained kind needs none."""
    if _pretrained(job, of):
        return []
    return [paths.data_manifest(job.results, prior_dataset(job, of))]


def _untrained_gan(job: Job, of: str | None) -> torch.nn.Module:
    """The prior's architecture (for a DCGAN, its dataset's channels), untrained
    (``gan.seed``)."""
    if _pretrained(job, of):
        return priors.untrained(job.config, prior_dataset(job, of))
    spec = job.config["gan"]
    channels = data.read_manifest(paths.data_dir(job.results, prior_dataset(job, of))
                                  )["shape"][0]
    return models.dcgan.untrained_generator(spec["latent_dim"], channels, spec["width"],
                                            spec["seed"], spec["resolution"])


def _bn_proxy(job: Job, model: torch.nn.Module):
    public = data.load_prepared(job.data_dir, "public").x
    return dataset_statistics(model, public.to(next(model.parameters()).device))


KINDS = {
    "gan": Kind(lambda job, of: [_gan(job, of)], lambda job, _model, of: _load_gan(job, of)),
    "untrained_gan": Kind(_untrained_files,
                          lambda job, _model, of: _untrained_gan(job, of)),
    "bn_proxy": Kind(lambda job, _of: [paths.data_manifest(job.results, job.dataset)],
                     lambda job, model, _of: _bn_proxy(job, model)),
    "defense": Kind(lambda job, _of: artifacts.defense_inputs(job),
                    lambda job, model, _of: artifacts.build_defense(job, model)),
}


# -- what a job costs ---------------------------------------------------------------------

def attack_iterations(name: str, params: dict) -> int:
    """Gradient-matching iterations of one restart of one victim of attack ``name``: the
    attack class's ``budget`` of its parameters with the schema's defaults (GIAS/GIML: the
    iterations of each stage of the variant; GIFD: the sum of its ``steps``; EOT: samples x
    the wrapped attack's; R-GAP: its latent search, else one)."""
    return attacks.base.registered(name).budget(cfg.resolve("attacks", name, params))


def attack_work(config: dict, labels: Iterable[str], deterministic: bool = False) -> Counter:
    """Gradient-matching iterations of one attack job (one seed), by the optimiser that runs
    them (``adam`` or ``lbfgs``): per label, victims x restarts x iterations, x the uploads
    of a sequence victim; a label in ``attack.attacker.adaptive`` once more for its adaptive
    attacker, x ``attack.attacker.adaptive_samples`` draws of the defense (one of a
    ``deterministic`` one)."""
    uploads = max(1, config["attack"]["protocol"]["sequence"]["steps"])
    draws = 1 if deterministic else config["attack"]["attacker"]["adaptive_samples"]
    work: Counter = Counter()
    for label in labels:
        name, params = plan.attack_of(config, label)
        restarts = cfg.resolve("attacks", name, params).get("restarts", 1)
        runs = 1 + (draws if label in config["attack"]["attacker"]["adaptive"] else 0)
        work[attacks.base.registered(name).optimizer] += plan.victims(config, label) \
            * restarts * attack_iterations(name, params) * uploads * runs
    return work


# -- the job --------------------------------------------------------------------------------

def attack_needs(job: Job, label: str) -> dict[str, str]:
    return attacks.needs(*plan.attack_of(job.resolved, label))


def needed(job: Job) -> list[str]:
    """Every artifact the job loads: its defense's, its attacks' and, for the noise-ratio
    metric, the evaluation network."""
    found = set(artifacts.defense_needs(job).values())
    if "noise_ratio" in job.resolved["attack"]["outputs"]["metrics"]:
        found.add("evalnet")
    for label in job.attacks:
        found |= set(attack_needs(job, label).values())
    return sorted(found)


def build_attack(job: Job, label: str, model: torch.nn.Module, defense: defenses.Defense,
                 seed: int) -> attacks.base.Attack:
    """The attack ``label`` with its artifacts loaded; the setting's ``defense`` is passed
    as built, so an adaptive attack samples the very defense that made the uploads."""
    name, params = plan.attack_of(job.resolved, label)
    wanted = attack_needs(job, label)
    loaded = artifacts.loaded({k: v for k, v in wanted.items() if v != "defense"}, job, model)
    loaded.update({k: defense for k, v in wanted.items() if v == "defense"})
    return attacks.build(name, seed=seed, **params, **loaded)


def build_adaptive(job: Job, label: str, model: torch.nn.Module, defense: defenses.Defense,
                   seed: int) -> attacks.base.Attack:
    """The adaptive attacker of ``label`` (``attack.attacker.adaptive``, decision 0072):
    EOT wrapping the label's attack and parameters, its trial gradients through
    ``defense``'s adaptive transformation, ``attack.attacker.adaptive_samples`` draws of a
    random defense per step."""
    name, params = plan.attack_of(job.resolved, label)
    loaded = artifacts.loaded({k: v for k, v in attack_needs(job, label).items()
                               if v != "defense"}, job, model)
    return attacks.build("eot", seed=seed, wraps=name, wraps_params=params,
                         samples=job.resolved["attack"]["attacker"]["adaptive_samples"],
                         defense=defense, **loaded)


def _check_sequence(spec: dict, built: dict) -> None:
    """ValueError, before any victim is made, unless ``attack.protocol.sequence`` can run: its
    values together (``victims.sequence_problem``) and every attack's cost sums over a
    sequence (``Attack.sequences``)."""
    if found := victims.sequence_problem(spec):
        raise ValueError(found)
    refused = [label for label, attack in built.items() if not attack.sequences]
    steps = spec["protocol"]["sequence"]["steps"]
    if steps and refused:
        raise ValueError(f"'attack.protocol.sequence.steps': {steps} uploads, but "
                         f"attack {refused[0]!r} cannot attack a sequence of uploads; expected "
                         f"attacks whose cost sums over a sequence (inverting_gradients, gias "
                         f"with sparsity 0, giml)")


def _attackers(labels: Iterable[str], built: dict, adaptive: dict
               ) -> list[tuple[str, str, attacks.base.Attack]]:
    """(label, attacker, attack) in the order they run: each label's paper attack, then its
    adaptive attacker where ``attack.attacker.adaptive`` names it."""
    return [(label, attacker, attack) for label in labels
            for attacker, attack in ((PAPER, built[label]), (ADAPTIVE, adaptive.get(label)))
            if attack is not None]


def run_attacks(config: dict, results: Path, case: str, setting: Setting, seed: int,
                resume: Resume | None = None) -> None:
    """The job's attacks, each against the same defended uploads of one setting; with
    ``resume``, each chunk of victims an attack finishes is kept there (a killed job's
    rerun continues after the last one)."""
    job = Job(config, results, case, setting, seed)
    plan.check_planned(plan.jobs(config), case, setting, "attack job")
    plan.check_seed(seed, config["attack"]["attacker"]["seeds"], "attack.attacker.seeds")
    labels = job.attacks
    if not labels:
        raise ValueError(f"setting {setting.text!r} of case {case!r} is planned for FL only; "
                         f"no attack runs on it")
    spec = job.resolved["attack"]
    outputs = spec["outputs"]
    counts = class_counts(results, job.dataset)  # None: not prepared (loading names it)
    if counts is not None and (why := problem(spec, counts, job.dataset)):
        raise ValueError(why)
    if resume is not None and (kept := resume.kept()):
        print(f"attack {case} {setting} seed {seed}: resuming with {len(kept)} finished "
              f"chunks of victims kept in {resume.folder}", file=sys.stderr)
    seeds = child_seeds(seed, ["victims", "defense", "attack"])
    device = select(config["device"])
    seed_everything(seeds["attack"], config["threads"])
    train = data.load_prepared(job.data_dir, "train")
    model = model_at(job, train, job.checkpoint).to(device).train(spec["protocol"]["train_mode"])
    defense = artifacts.build_defense(job, model)
    built = {label: build_attack(job, label, model, defense, seeds["attack"]) for label in labels}
    adaptive = {label: build_adaptive(job, label, model, defense, seeds["attack"])
                for label in labels if label in spec["attacker"]["adaptive"]}
    _check_sequence(spec, {**built, **{f"{k} (adaptive)": a for k, a in adaptive.items()}})
    evalnet = (artifacts.loaded({"metric": "evalnet"}, job, None)["metric"]
               if "noise_ratio" in outputs["metrics"] else None)
    observe = victims.sequence_observations if spec["protocol"]["sequence"]["steps"] \
        else victims.observations
    observations, truths = observe(job, model, train, defense, seeds)
    colour = train.x.mean((0, 2, 3))  # the data's mean colour: the bar of decision 0111
    out = paths.attack_dir(results, case, setting, seed)
    runs = {}
    for label, attacker, attack in _attackers(labels, built, adaptive):
        count = plan.victims(job.resolved, label)
        try:
            recs = attacks.reconstruct_all(attack, observations[:count], outputs["snapshots"],
                                           progress=f"{label} ({attacker}) vs {setting}",
                                           kept=_kept(resume, f"{label}.{attacker}"))
        except (ArithmeticError, torch.linalg.LinAlgError) as err:  # numerical breakdown
            recs = [records.failed(obs, f"failed: {type(err).__name__}: {err}",
                                   outputs["snapshots"]) for obs in observations[:count]]
        kept, matched = zip(*(records.victim_record(v, truth, obs, rec, outputs["metrics"],
                                                    evalnet, attacker, outputs["lpips_net"],
                                                    colour)
                              for v, (truth, obs, rec)
                              in enumerate(zip(truths, observations, recs))))
        if spec["victims"]["class"] is not None:  # CENSOR Fig. 3: are they alike?
            records.add_likeness(list(kept), list(matched), truths[:len(kept)])
        records.save_details(paths.attack_details(results, case, setting, seed),
                             label if attacker == PAPER else f"{label}.adaptive", recs, truths,
                             list(matched), spec)
        run = runs.setdefault(label, {"attack": plan.attack_of(job.resolved, label)[0],
                                      "params": plan.attack_of(job.resolved, label)[1],
                                      "victims": []})
        run["victims"] += kept
        if attacker == ADAPTIVE:  # what ran as the adaptive attacker: EOT's samples
            run["adaptive"] = {"attack": "eot", "samples": attack.draws,
                               "defense": attack.defense.name}
        summary = ", ".join(f"{m} {records.finite_mean([r[m] for r in kept]):.4g}"
                            for m in outputs["metrics"][:2])
        broken = [f"victim {r['victim']}: {r['failure']}" for r in kept if r["failure"]]
        print(f"{label} ({attacker}) vs {setting}: {summary} over {count} victims"
              + (f"; {len(broken)} failed ({'; '.join(broken)})" if broken else ""),
              file=sys.stderr)
    write_json(out / "metrics.json", {
        "case": case, "setting": setting.text, "defense": setting.label,
        "strength": setting.strength, "seed": seed, "round": spec["protocol"]["round"],
        "runs": runs, "snapshots": outputs["snapshots"],
        "lpips_unavailable": (metrics.lpips_unavailable_reason(outputs["lpips_net"])
                              if "lpips" in outputs["metrics"] else None),
    })
    if resume is not None:
        resume.finish()


def _kept(resume: Resume | None, run: str) -> attacks.engine.Kept | None:
    """The engine's chunks of the run ``run`` (label.attacker), kept in ``resume``."""
    if resume is None:
        return None
    return lambda begin, attack: resume.piece(
        f"{run}.{begin}", attack, lambda recs: [dataclasses.asdict(r) for r in recs],
        lambda kept: [attacks.Reconstruction(**r) for r in kept])


# -- the declaration ------------------------------------------------------------------------


def _params(config: dict, results: Path, job: dict) -> dict:
    """What an attack job reads from the configuration."""
    resolved = plan.resolve(config, job["setting"])
    labels = plan.jobs(config).get((job["case"], job["setting"]), ())
    return {"attack": resolved["attack"], "fl": resolved["fl"],
            "defense": plan.defense_of(resolved, job["setting"]),
            "attacks": {label: plan.attack_of(resolved, label) for label in labels},
            # a pretrained prior's architecture, space and classes (a DCGAN's are its file's)
            **({"gan": resolved["gan"]} if priors.pretrained(resolved) else {})}


def _work(config: dict, results: Path, job: dict) -> dict[str, int]:
    """Its attacks' iterations (``attack_work``), each one ``match`` or ``lbfgs`` unit of the
    case's model at the victims' batch, per local step a trial unrolls (FedAvg; per epoch of
    ``fl.local_epochs``, whose mini-batches together are the batch)."""
    resolved = plan.resolve(config, job["setting"])
    labels = plan.jobs(config).get((job["case"], job["setting"]), ())
    deterministic = defenses.registered(plan.defense_of(config, job["setting"])[0]).deterministic
    local = victims.local_protocol(resolved["fl"], resolved["attack"])
    steps = local.get("local_steps", 1) // local.get("local_batches", 1)  # one batch an epoch
    return {cost.model_unit(config, results, job["case"],
                            "lbfgs" if optimizer == "lbfgs" else "match",
                            resolved["attack"]["protocol"]["batch_size"]): iterations * steps
            for optimizer, iterations in attack_work(resolved, labels, deterministic).items()}


def _gpu(config: dict, results: Path, job: dict) -> bool:
    """A GPU under ``device: auto`` unless every attack of the job runs L-BFGS (DLG, iDLG,
    EPAFL's) on a model in ``CPU_MODELS``: an L-BFGS iteration of a batch-1 LeNet took
    1.6-2.8x longer on an H200 than on one of its CPU cores (up to 20 evaluations of a tiny
    network, launch- and sync-bound)."""
    labels = plan.jobs(config).get((job["case"], job["setting"]), ())
    return not (plan.find_case(config, job["case"])["model"] in CPU_MODELS and all(
        attacks.base.registered(plan.attack_of(config, label)[0]).optimizer == "lbfgs"
        for label in labels))


PHASE = Phase(
    name="attack",
    summary="every configured attack against one setting's uploads",
    wildcards=("case", "setting", "seed"),
    folders=("attacks",),
    reads=("prepare_data", "train_evalnet", "train_gan", "fl_run", "train_zoo", "train_giml",
           "train_inverter"),
    outputs=lambda config, results, jobs=None: {
        "metrics": Output(paths.attack_metrics(results, "{case}", "{setting}", "{seed}")),
        "details": Output(paths.attack_details(results, "{case}", "{setting}", "{seed}"),
                          directory=True)},
    run=run_attacks,
    planned=lambda config: [{"case": case, "setting": setting, "seed": seed}
                            for case, setting in plan.attack_jobs(config)
                            for seed in config["attack"]["attacker"]["seeds"]],
    inputs=lambda config, results, job: [
        paths.data_manifest(results, plan.find_case(config, job["case"])["dataset"]),
        Job.of(config, results, job).checkpoint],
    artifacts=lambda config, results, job: needed(Job.of(config, results, job)),
    params=_params,
    gpu=_gpu,
    timed=True,
    work=_work,
    startup="startup:gradients",
    priority=artifacts.trained_first,
    kinds=KINDS,
    resumable=True,
)

