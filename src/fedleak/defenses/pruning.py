"""Gradient pruning (Zhu et al., DLG §5, "gradient compression"; Aji and Heafield, 2017).

Per layer, the fraction ``ratio`` of gradient entries with the smallest score is
set to zero. Modes (Refiner §3.2.2, Table 1): ``grad`` scores by |gradient| (the
classic defense, default), ``weight`` by |parameter value| and ``weight_grad`` by
|gradient x value|, the element-wise importance Refiner's utility metric uses.
"""

from __future__ import annotations

import torch

from fedleak.defenses.base import Defense, DefenseContext, register
from fedleak.types import Update


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
    def __init__(self, *, ratio: float, mode: str) -> None:
        self.ratio, self.mode = ratio, mode

    def __call__(self, ctx: DefenseContext) -> Update:
        values = dict(ctx.model.named_parameters())
        out = Update()
        for k, g in ctx.true_gradient().items():
            w = values[k].detach()
            score = {"grad": g.abs(), "weight": w.abs(), "weight_grad": (g * w).abs()}[self.mode]
            out[k] = prune_smallest(score, g, self.ratio)
        return out
