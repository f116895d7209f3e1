"""Observation, Reconstruction and the attack registry (DESIGN §3)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from fedleak.attacks.early_stopping import Stopper
from fedleak.utils.registry import Registry


@dataclass
class Observation:
    """What the attacker sees: the model at that round and the (defended) update."""

    model: nn.Module
    gradient: dict[str, torch.Tensor]
    batch_size: int
    labels: torch.Tensor | None = None
    input_shape: tuple[int, int, int] | None = None
    # BN_exact (GradInversion): the client's batch (mean, var) per BatchNorm layer, model order
    bn_statistics: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        names = {n for n, _ in self.model.named_parameters()}
        if set(self.gradient) != names:
            raise ValueError(f"gradient keys {sorted(self.gradient)} do not match the model's "
                             f"parameters {sorted(names)}")
        if self.input_shape is None:
            self.input_shape = tuple(getattr(self.model, "input_shape", ()))
            if len(self.input_shape) != 3:
                raise ValueError("input_shape is needed: the model has no input_shape attribute")
        if self.labels is not None and self.labels.shape != (self.batch_size,):
            raise ValueError(f"labels must have shape ({self.batch_size},), "
                             f"got {tuple(self.labels.shape)}")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def randn(self, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """N(0, 1) drawn on the CPU generator (device-independent), moved to the model's device."""
        return torch.randn(shape, generator=generator).to(self.device)

    @property
    def num_classes(self) -> int:
        return last_linear_weight(self)[1].shape[0]

    def parameters(self) -> list[torch.Tensor]:
        return [p for _, p in self.model.named_parameters()]

    def target_gradient(self) -> list[torch.Tensor]:
        return [self.gradient[n].detach() for n, _ in self.model.named_parameters()]


def last_linear_weight(obs: Observation) -> tuple[str, torch.Tensor]:
    """Name and observed gradient of the last 2-D weight (the classifier layer)."""
    names = [n for n, p in obs.model.named_parameters() if p.ndim == 2]
    if not names:
        raise ValueError("the model has no Linear layer to read labels from")
    return names[-1], obs.gradient[names[-1]]


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


Attack = Callable[..., Reconstruction]
_REGISTRY = Registry("attack")
register = _REGISTRY.register
available = _REGISTRY.available
registered = _REGISTRY.get  # the attack class of a name (e.g. to inspect its parameters)


def build(name: str, **params) -> Attack:
    """An attack by registered name; ``params`` override its paper defaults."""
    return _REGISTRY.get(name)(**params)


def reconstruct_all(attack: Attack, observations: list[Observation]) -> list[Reconstruction]:
    """One Reconstruction per observation (victim), vectorised when possible (DESIGN §7).

    Victim v is attacked with seed ``attack.seed + v`` (when the attack has a ``seed``),
    as if built with that seed on its own. ``attack.reconstruct_many`` runs all victims
    at once when the attack has it and the problems vectorise: one model object, the
    same batch size and input shape, Adam, no stopper. Otherwise (L-BFGS attacks such as
    DLG/iDLG, stoppers, CMA-ES) each victim is attacked in turn with ``attack(obs)``.
    """
    if not observations:
        return []
    first = observations[0]
    vectorisable = (
        hasattr(attack, "reconstruct_many")
        and len(observations) * getattr(attack, "restarts", 1) > 1  # one problem: loop is faster
        and getattr(attack, "stopper", None) is None
        and getattr(attack, "optimizer", "adam") == "adam"
        and all(obs.model is first.model and obs.batch_size == first.batch_size
                and obs.input_shape == first.input_shape for obs in observations))
    if vectorisable:
        return attack.reconstruct_many(observations)
    return [_for_victim(attack, v)(obs) for v, obs in enumerate(observations)]


def _for_victim(attack: Attack, victim: int) -> Attack:
    """``attack`` with seed ``attack.seed + victim`` (a shallow copy), or ``attack`` itself."""
    if victim == 0 or not isinstance(getattr(attack, "seed", None), int):
        return attack
    seeded = copy.copy(attack)
    seeded.seed = attack.seed + victim
    return seeded


def stopper_from(spec: dict | Stopper | None) -> Stopper | None:
    if spec is None or isinstance(spec, Stopper):
        return spec
    return Stopper(**spec)
