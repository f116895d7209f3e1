"""Per-layer gradient clipping (CENSOR, Zhang et al., NDSS 2025, §V-A, Eq. 8).

Each layer's gradient g_l becomes g_l * min(1, b / ||g_l||_2); a smaller bound b
is a stronger defense. CENSOR's baseline uses b = 4 (the default).
"""

from __future__ import annotations

from fedleak.defenses.base import Defense, DefenseContext, register
from fedleak.types import Update


@register("clipping")
class Clipping(Defense):
    def __init__(self, *, bound: float) -> None:
        self.bound = bound

    def __call__(self, ctx: DefenseContext) -> Update:
        return ctx.true_gradient().map(
            lambda g: g * min(1.0, self.bound / (float(g.norm()) + 1e-12)))
