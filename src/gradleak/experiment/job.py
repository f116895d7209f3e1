"""One job's identity in a configuration (case, setting, seed) with what follows from it:
the case's entry, the setting's resolved configuration, its folders and its model."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from gradleak import data, models
from gradleak.experiment import fl_runs, paths, plan
from gradleak.settings import Setting
from gradleak.utils.io import load_state, load_torch


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

    @classmethod
    def of(cls, config: dict, results: Path, identity: dict) -> Job:
        """The job of a phase's identity (its wildcards' values: case, setting, seed)."""
        return cls(config, results, identity["case"], identity["setting"], identity["seed"])

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
        return paths.checkpoint(self.results, self.case,
                                fl_runs.model_setting(self.config, self.setting),
                                self.seed, round_)


def build_model(case: dict, prepared: data.ImageData) -> torch.nn.Module:
    """The case's model for the prepared data's shape and classes (initial weights drawn
    from torch's global generator)."""
    return models.for_case(case, tuple(prepared.x.shape[1:]), prepared.num_classes)


def model_at(job: Job, train: data.ImageData, checkpoint: Path) -> torch.nn.Module:
    """The case's model with the weights saved in ``checkpoint``."""
    model = build_model(job.spec, train)
    return load_state(model, load_torch(checkpoint), checkpoint,
                      f"case {job.case!r} ({type(model).__name__})")
