"""Artifacts that defenses and attacks declare as ``needs`` (``fedleak.types.Need``):
for each kind, the files a job needs built first and how the constructor argument is
loaded from them. Snakemake rules take their inputs from :func:`defense_inputs` and
:func:`attack_inputs`, so the files a rule waits for are the ones the job will load."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from torch import nn

from fedleak import adversaries, attacks, data, defenses, models
from fedleak.attacks.bn_statistics import dataset_statistics
from fedleak.experiment import paths, plan, priors
from fedleak.types import Setting, artifact_parts
from fedleak.utils.device import to_device


@dataclass
class Job:
    """One (case, setting, seed) of a configuration, with its results folder."""

    config: dict
    results: Path
    case: str
    setting: Setting
    seed: int
    zoo_round: int | None = None  # the round whose model zoo RecUP-FL loads (None: the first)

    def __post_init__(self) -> None:
        self.results = Path(self.results)
        plan.check_setting(self.config, self.case, self.setting)

    @cached_property
    def spec(self) -> dict:
        """The case's entry of the configuration."""
        return plan.find_case(self.config, self.case)

    @cached_property
    def resolved(self) -> dict:
        """The configuration with the setting's overrides applied."""
        return plan.resolve(self.config, self.setting)

    @property
    def dataset(self) -> str:
        return self.spec["dataset"]

    @property
    def attacks(self) -> tuple[str, ...]:
        """The attack labels this job's attack phase runs."""
        return plan.jobs(self.config).get((self.case, self.setting), ())

    @property
    def data_dir(self) -> Path:
        return paths.data_dir(self.results, self.dataset)

    @property
    def fl_dir(self) -> Path:
        return paths.fl_dir(self.results, self.case, plan.fl_setting(self.setting), self.seed)

    @property
    def checkpoint(self) -> Path:
        round_ = plan.saved_round(self.resolved["attack"])
        return paths.checkpoint(self.results, self.case, plan.fl_setting(self.setting),
                                self.seed, round_)


@dataclass(frozen=True)
class Kind:
    """An artifact kind's files (what the job waits for) and loader (the argument built from
    them, given the attacked model). Both take what the needed artifact is of
    (``types.artifact``: ``"gan:natural"`` is the prior of dataset ``natural``,
    ``"giml_generator:4"`` GIML's generator at outer step 4); None: the configuration's own."""

    files: Callable[[Job, str | None], list[Path]]
    load: Callable[[Job, nn.Module | None, str | None], Any]


def _public(job: Job) -> data.ImageData:
    return data.load_prepared(job.data_dir, "public")


def _evalnet(job: Job) -> Path:
    return paths.evalnet_file(job.results, job.dataset)


def prior_dataset(job: Job, of: str | None) -> str:
    """The dataset a GAN prior is of: an attack's ``prior_dataset``, else ``gan.dataset``."""
    return of or job.config["gan"]["dataset"]


def _gan(job: Job, of: str | None = None) -> Path:
    """The prior's file: the pipeline's DCGAN of the dataset, or the pretrained kind's
    weights (``gan.weights``, of no dataset)."""
    if priors.pretrained(job.config):
        return priors.weights(job.config)
    return paths.gan_file(job.results, prior_dataset(job, of))


def _load_gan(job: Job, of: str | None) -> nn.Module:
    if priors.pretrained(job.config):
        return priors.load(job.config)
    return models.dcgan.load_generator(_gan(job, of))


def _giml(job: Job) -> Path:
    return paths.giml_file(job.results, job.case)


def _untrained_files(job: Job, of: str | None) -> list[Path]:
    """A DCGAN's channels are its dataset's (its manifest); a pretrained kind needs none."""
    if priors.pretrained(job.config):
        return []
    return [paths.data_manifest(job.results, prior_dataset(job, of))]


def _untrained_gan(job: Job, of: str | None) -> nn.Module:
    """The prior's architecture (for a DCGAN, its dataset's channels), untrained
    (``gan.seed``)."""
    if priors.pretrained(job.config):
        return priors.untrained(job.config)
    spec = job.config["gan"]
    channels = data.read_manifest(paths.data_dir(job.results, prior_dataset(job, of))
                                  )["shape"][0]
    return models.dcgan.untrained_generator(spec["latent_dim"], channels, spec["width"],
                                            spec["seed"], spec["resolution"])


def _zoo_files(job: Job) -> list[Path]:
    return [paths.zoo_file(job.results, job.case, job.seed, r)
            for r in job.config["attribute"]["rounds"]]


def _zoo(job: Job) -> adversaries.ModelZoo:
    round_ = job.config["attribute"]["rounds"][0] if job.zoo_round is None else job.zoo_round
    return adversaries.load_zoo(paths.zoo_file(job.results, job.case, job.seed, round_))


KINDS: dict[str, Kind] = {
    "evalnet": Kind(lambda job, _: [_evalnet(job)],
                    lambda job, _m, _: models.evalnet.load_evaluation_network(_evalnet(job))),
    "gan": Kind(lambda job, of: [_gan(job, of)], lambda job, _, of: _load_gan(job, of)),
    "untrained_gan": Kind(_untrained_files, lambda job, _, of: _untrained_gan(job, of)),
    "giml_generator": Kind(lambda job, _: [_giml(job)],
                           lambda job, _, of: models.dcgan.load_generator(
                               _giml(job), step=None if of is None else int(of))),
    "public_data": Kind(lambda job, _: [paths.data_manifest(job.results, job.dataset)],
                        lambda job, _m, _: (_public(job).x, _public(job).y)),
    "bn_proxy": Kind(lambda job, _: [paths.data_manifest(job.results, job.dataset)],
                     lambda job, model, _: dataset_statistics(
                         model, _public(job).x.to(next(model.parameters()).device))),
    "model_zoo": Kind(lambda job, _: _zoo_files(job), lambda job, _m, _: _zoo(job)),
    "defense": Kind(lambda job, _: defense_inputs(job),
                    lambda job, model, _: build_defense(job, model)),
}


def artifact_files(job: Job, needed: str) -> list[Path]:
    """The files of one needed artifact (``"gan"``, ``"gan:natural"``, ...)."""
    kind, of = artifact_parts(needed)
    return KINDS[kind].files(job, of)


def defense_needs(job: Job) -> dict[str, str]:
    return defenses.needs(*plan.defense_of(job.resolved, job.setting))


def attack_needs(job: Job, label: str) -> dict[str, str]:
    return attacks.needs(*plan.attack_of(job.resolved, label))


def _files(needed: dict[str, str], job: Job) -> list[Path]:
    return [f for kind in needed.values() for f in artifact_files(job, kind)]


def defense_inputs(job: Job) -> list[Path]:
    """The files the setting's defense loads (e.g. Refiner's evaluation network)."""
    return _files(defense_needs(job), job)


def metric_needs(job: Job) -> dict[str, str]:
    """The noise-ratio metric needs the evaluation network."""
    return {"metric": "evalnet"} if "noise_ratio" in job.resolved["attack"]["metrics"] else {}


def attack_inputs(job: Job) -> list[Path]:
    """The files an attack job loads: its attacks' artifacts, the defense's, and the
    evaluation network when the noise-ratio metric is asked for."""
    files = [*defense_inputs(job), *_files(metric_needs(job), job)]
    for label in job.attacks:
        files += _files(attack_needs(job, label), job)
    return sorted(set(files))


def kinds_needed(job: Job) -> set[str]:
    """Every artifact the job's defense, attacks and metrics need (``types.artifact``:
    a kind, or a kind of a dataset or step)."""
    kinds = set(defense_needs(job).values())
    if job.attacks:
        kinds |= set(metric_needs(job).values())
    for label in job.attacks:
        kinds |= set(attack_needs(job, label).values())
    return kinds


def _loaded(needed: dict[str, str], job: Job, model: nn.Module | None) -> dict[str, Any]:
    """The needed artifacts, each on ``model``'s device when there is a model (networks,
    generators, the model zoo, public data; files are read on the CPU)."""
    loaded = {}
    for arg, artifact in needed.items():
        kind, of = artifact_parts(artifact)
        loaded[arg] = KINDS[kind].load(job, model, of)
    if model is None:
        return loaded
    return to_device(loaded, next(model.parameters()).device)


def build_defense(job: Job, model: nn.Module | None = None) -> defenses.Defense:
    """The setting's defense, with the artifacts it declares loaded."""
    name, params = plan.defense_of(job.resolved, job.setting)
    return defenses.build(name, **params, **_loaded(defense_needs(job), job, model))


def build_attack(job: Job, label: str, model: nn.Module, defense: defenses.Defense,
                 seed: int) -> attacks.base.Attack:
    """The attack ``label`` with its artifacts loaded; the setting's ``defense`` is passed
    as built, so an adaptive attack samples the very defense that made the uploads."""
    name, params = plan.attack_of(job.resolved, label)
    needed = attack_needs(job, label)
    loaded = _loaded({k: v for k, v in needed.items() if v != "defense"}, job, model)
    if "defense" in needed.values():
        loaded.update({k: defense for k, v in needed.items() if v == "defense"})
    return attacks.build(name, seed=seed, **params, **loaded)


def build_adaptive(job: Job, label: str, model: nn.Module, defense: defenses.Defense,
                   seed: int) -> attacks.base.Attack:
    """The adaptive attacker of ``label`` (``attack.adaptive``, issue 33): EOT wrapping the
    label's attack and parameters, its trial gradients through ``defense``'s adaptive
    transformation, ``attack.adaptive_samples`` draws of a random defense per step."""
    name, params = plan.attack_of(job.resolved, label)
    loaded = _loaded({k: v for k, v in attack_needs(job, label).items() if v != "defense"},
                     job, model)
    return attacks.build("eot", seed=seed, wraps=name, wraps_params=params,
                         samples=job.resolved["attack"]["adaptive_samples"], defense=defense,
                         **loaded)
