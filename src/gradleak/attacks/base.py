"""Reconstruction and the attack registry.

An attack is ``attack(obs) -> Reconstruction`` (``engine.Attack``); ``build`` fills its
parameters from the schema's defaults (the papers'), and ``engine.reconstruct_all`` runs
it on the victims of a round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gradleak.attacks.early_stopping import Stopper
from gradleak.utils.registry import Registry


@dataclass
class Reconstruction:
    images: torch.Tensor  # (B, C, H, W) in [0, 1]
    labels: torch.Tensor  # (B,)
    loss_trace: list[float]
    iterations: int
    wall_time: float
    stop_reason: str
    restart: int = 0
    extra: dict = field(default_factory=dict)
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)  # iteration -> images


_REGISTRY = Registry("attacks")
register = _REGISTRY.register
available = _REGISTRY.available
needs = _REGISTRY.needs
registered = _REGISTRY.get  # the attack class of a name


def build(name: str, **params):
    """An attack by registered name; ``params`` override its schema defaults (the papers')."""
    return _REGISTRY.build(name, **params)


def stopper_from(spec: dict | Stopper | None) -> Stopper | None:
    """A Stopper from its configuration mapping (None: run every iteration)."""
    if spec is None or isinstance(spec, Stopper):
        return spec
    return Stopper(**spec)
