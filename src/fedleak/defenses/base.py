"""Defense context and registry (DESIGN §3): ``defense(ctx) -> Update``.

Each defense has one named strength knob (``knob``) that the workflow sweeps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
from torch import nn

from fedleak.fl.client import Update, gradient
from fedleak.utils.registry import Registry


@dataclass
class DefenseContext:
    """One client's view when it defends its upload."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    gradient: Update | None = None

    def true_gradient(self) -> Update:
        """The undefended gradient of the client batch (computed once)."""
        if self.gradient is None:
            self.gradient = {k: v.detach() for k, v in gradient(self.model, self.x, self.y).items()}
        return self.gradient


class Defense(ABC):
    """Base class: subclasses set ``knob`` and implement ``__call__``."""

    name: str = ""
    knob: str | None = None
    stronger_when: str = "higher"  # "lower" when a smaller knob protects more (bits)

    @abstractmethod
    def __call__(self, ctx: DefenseContext) -> Update:
        """The update to upload."""

    @property
    def strength(self) -> float:
        return 0.0 if self.knob is None else float(getattr(self, self.knob))


_REGISTRY = Registry("defense")
register = _REGISTRY.register
available = _REGISTRY.available


def knob(name: str) -> str | None:
    """The name of a defense's strength parameter (None for ``none``)."""
    return _REGISTRY.get(name).knob


def strongest(name: str, strengths: list[float]) -> float:
    """The strongest of ``strengths`` for defense ``name``."""
    return (min if _REGISTRY.get(name).stronger_when == "lower" else max)(strengths)


def build(name: str, **params) -> Defense:
    """A defense by registered name; ``params`` override its paper defaults."""
    return _REGISTRY.get(name)(**params)


def build_at(name: str, strength: float, **params) -> Defense:
    """A defense with its strength knob set to ``strength``."""
    key = knob(name)
    if key is None:
        if strength != 0:
            raise ValueError(f"defense {name!r} has no strength knob; strength must be 0, "
                             f"got {strength}")
        return build(name, **params)
    return build(name, **{**params, key: strength})


def require_non_negative(name: str, value: float) -> float:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value
