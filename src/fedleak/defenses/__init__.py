"""Gradient defenses behind one interface: ``defense(ctx) -> Update``."""

from fedleak.defenses import (  # noqa: F401  (registration)
    censor,
    clipping,
    differential_privacy,
    layer_noise,
    none,
    pruning,
    quantization,
    recupfl,
    refiner,
    soteria,
)
from fedleak.defenses.base import (
    Defense,
    available,
    build,
    build_at,
    knob,
    needs,
    registered,
    strongest,
)
from fedleak.types import DefenseContext, Update

__all__ = ["Defense", "DefenseContext", "Update", "available", "build", "build_at", "knob",
           "needs", "registered", "strongest"]
