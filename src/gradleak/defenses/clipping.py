"""Per-layer gradient clipping (CENSOR, Zhang et al., NDSS 2025, §V-A, Eq. 8).

Each layer's gradient g_l becomes g_l * min(1, b / ||g_l||_2); a smaller bound b
is a stronger defense. CENSOR's baseline uses b = 4 (the default).

The adaptive attacker (decision 0072; GGL, Li et al. CVPR 2022 §3.3) clips its trial gradient
the same way, differentiably (the factor min(1, b / ||g_l||) too), with the defense's own
bound b, known to an attacker who knows the defense (GGA's ``clipping`` transform
estimates it from the received upload instead).
"""

from __future__ import annotations

from gradleak.defenses.base import Defense, DefenseContext, register
from gradleak.types import Update


@register("clipping")
class Clipping(Defense):
    deterministic = True

    def __init__(self, *, bound: float) -> None:
        self.bound = bound

    def __call__(self, ctx: DefenseContext) -> Update:
        return ctx.true_gradient().map(
            lambda g: g * min(1.0, self.bound / (float(g.norm()) + 1e-12)))

    def adaptive(self, trial: Update, ctx: DefenseContext, received: Update) -> Update:
        """Eq. 8 on each layer of ``trial``, differentiable in the factor too."""
        return trial.map(lambda g: g * (self.bound / (g.norm() + 1e-12)).clamp(max=1.0))
