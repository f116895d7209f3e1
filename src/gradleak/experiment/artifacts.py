"""Artifacts that defenses and attacks declare as ``needs`` (``needs.Need``): each kind's
files and loader are declared by one phase module (``phases.KINDS`` names it), so a rule
waits for exactly the files its job loads, and the job's code includes that loader's."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch import nn

from gradleak import defenses
from gradleak.experiment import phases, plan
from gradleak.experiment.job import Job
from gradleak.needs import artifact_parts
from gradleak.utils.device import to_device


def files(job: Job, needed: Iterable[str]) -> list[Path]:
    """The files of the needed artifacts (``"gan"``, ``"gan:natural"``, ...), sorted."""
    found: set[Path] = set()
    for artifact in needed:
        kind, of = artifact_parts(artifact)
        found.update(phases.kind(kind).files(job, of))
    return sorted(found)


def modules(needed: Iterable[str]) -> set[str]:
    """The modules that declare the loaders of the needed artifacts."""
    return {phases.module_name(phases.KINDS[artifact_parts(a)[0]]) for a in needed}


def loaded(needed: dict[str, str], job: Job, model: nn.Module | None) -> dict[str, Any]:
    """Argument -> the needed artifact loaded, on ``model``'s device when there is a model
    (networks, generators, the model zoo, public data; files are read on the CPU)."""
    found = {}
    for arg, artifact in needed.items():
        kind, of = artifact_parts(artifact)
        found[arg] = phases.kind(kind).load(job, model, of)
    if model is None:
        return found
    return to_device(found, next(model.parameters()).device)


def defense_needs(job: Job) -> dict[str, str]:
    """Argument -> artifact of the setting's defense (e.g. Refiner's evaluation network)."""
    return defenses.needs(*plan.defense_of(job.resolved, job.setting))


def defense_inputs(job: Job) -> list[Path]:
    """The files the setting's defense loads."""
    return files(job, defense_needs(job).values())


def build_defense(job: Job, model: nn.Module | None = None) -> defenses.Defense:
    """The setting's defense, with the artifacts it declares loaded."""
    name, params = plan.defense_of(job.resolved, job.setting)
    return defenses.build(name, **params, **loaded(defense_needs(job), job, model))


def trained_first(config: dict, results: Path, identity: dict) -> int:
    """Snakemake's priority of an FL, attack or attribute job: 1 for a setting whose
    defense loads a trained artifact (RecUP-FL's zoo, Refiner's network), whose jobs are
    the longest, so they start first (no long job left running alone at the end)."""
    job = Job.of(config, results, identity)
    return int(bool(defense_needs(job)))
