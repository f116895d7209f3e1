"""Gradient pruning (Zhu et al., DLG §5, "gradient compression"; Aji and Heafield, 2017).

Per layer, the fraction ``ratio`` of gradient entries with the smallest magnitude
is set to zero.
"""

from __future__ import annotations

import torch

from fedleak.defenses.base import Defense, DefenseContext, register
from fedleak.fl.client import Update


def prune_smallest(score: torch.Tensor, values: torch.Tensor, ratio: float) -> torch.Tensor:
    """Zero the ``ratio`` fraction of ``values`` with the smallest ``score`` (ties by index)."""
    count = int(ratio * values.numel())
    if count == 0:
        return values.clone()
    order = torch.argsort(score.flatten(), stable=True)
    mask = torch.ones(values.numel(), dtype=values.dtype, device=values.device)
    mask[order[:count]] = 0
    return values * mask.view_as(values)


@register("pruning")
class Pruning(Defense):
    knob = "ratio"

    def __init__(self, ratio: float = 0.2) -> None:
        if not 0 <= ratio <= 1:
            raise ValueError(f"pruning ratio must be in [0, 1], got {ratio}")
        self.ratio = ratio

    def __call__(self, ctx: DefenseContext) -> Update:
        return {k: prune_smallest(g.abs(), g, self.ratio) for k, g in ctx.true_gradient().items()}
