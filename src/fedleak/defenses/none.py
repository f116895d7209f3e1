"""No defense: the client uploads its true gradient."""

from __future__ import annotations

from fedleak.defenses.base import Defense, DefenseContext, register
from fedleak.fl.client import Update


@register("none")
class NoDefense(Defense):
    knob = None

    def __call__(self, ctx: DefenseContext) -> Update:
        return dict(ctx.true_gradient())
