"""Gradient defenses behind one interface: ``defense(ctx) -> Update`` (DESIGN §3)."""

from fedleak.defenses import differential_privacy, none, pruning, quantization  # noqa: F401
from fedleak.defenses.base import (
    Defense,
    DefenseContext,
    available,
    build,
    build_at,
    knob,
    strongest,
)

__all__ = ["Defense", "DefenseContext", "available", "build", "build_at", "knob", "strongest"]
