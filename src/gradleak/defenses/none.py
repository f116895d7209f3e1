"""No defense: the client uploads its true gradient."""

from __future__ import annotations

from gradleak.defenses.base import Defense, DefenseContext, register
from gradleak.types import Update


@register("none")
class NoDefense(Defense):
    deterministic = True  # the adaptive attacker's transformation is the identity

    def __call__(self, ctx: DefenseContext) -> Update:
        return Update(ctx.true_gradient())
