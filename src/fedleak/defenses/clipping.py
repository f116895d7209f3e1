"""Per-layer gradient clipping (CENSOR, Zhang et al., NDSS 2025, §V-A, Eq. 8).

Each layer's gradient g_l becomes g_l * min(1, b / ||g_l||_2); a smaller bound b
is a stronger defense. CENSOR's baseline uses b = 4.
"""

from __future__ import annotations

from fedleak.defenses.base import Defense, DefenseContext, register
from fedleak.fl.client import Update


@register("clipping")
class Clipping(Defense):
    knob = "bound"
    stronger_when = "lower"

    def __init__(self, bound: float = 4.0) -> None:
        if bound <= 0:
            raise ValueError(f"clipping bound must be > 0, got {bound}")
        self.bound = bound

    def __call__(self, ctx: DefenseContext) -> Update:
        return {k: g * min(1.0, self.bound / (float(g.norm()) + 1e-12))
                for k, g in ctx.true_gradient().items()}
