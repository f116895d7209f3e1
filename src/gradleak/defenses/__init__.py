"""Gradient defenses behind one interface: ``defense(ctx) -> Update``."""

from gradleak.defenses import (  # noqa: F401  (registration)
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
from gradleak.defenses.base import (
    Defense,
    available,
    build,
    build_at,
    knob,
    needs,
    registered,
    strongest,
)
from gradleak.types import DefenseContext, Update

__all__ = ["Defense", "DefenseContext", "Update", "available", "build", "build_at", "knob",
           "needs", "registered", "strongest"]
