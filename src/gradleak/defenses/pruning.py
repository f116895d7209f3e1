"""Gradient pruning (Zhu et al., DLG §5, "gradient compression"; Aji and Heafield, 2017).

The fraction ``ratio`` of gradient entries with the smallest score is set to zero, in
each parameter tensor (``scope: layer``, DLG's code, the default) or over the whole model
at once (``scope: model``, one threshold; Refiner §3.2.2 does not say which it used).
Modes (Refiner §3.2.2, Table 1): ``grad`` scores by |gradient| (the classic defense,
default), ``weight`` by |parameter value| and ``weight_grad`` by |gradient x value|, the
element-wise importance Refiner's utility metric uses.

The adaptive attacker (decision 0072; GGL, Li et al. CVPR 2022 §3.3, and CENSOR §II-C's
adaptive transform) applies the received upload's zero pattern to its trial gradient:
the pruned entries leave the matching. Re-pruning the trial by its own scores would
zero other entries wherever its gradient is not yet the client's (mode ``grad``); the
received pattern is the defense's exact choice, known to whoever sees the upload.
"""

from __future__ import annotations

import torch

from gradleak.defenses.base import Defense, DefenseContext, register
from gradleak.types import Update


def prune_smallest(score: torch.Tensor, values: torch.Tensor, ratio: float) -> torch.Tensor:
    """Zero the ``ratio`` fraction of ``values`` with the smallest ``score`` (ties by index):
    every entry below the count-th smallest score, then the first entries equal to it, by a
    selection rather than a sort (a stable sort's first ``count``, exactly)."""
    count = int(ratio * values.numel())
    if count == 0:
        return values.clone()
    flat = score.flatten()
    cut = flat.kthvalue(count).values
    tied = flat == cut
    pruned = (flat < cut) | (tied & (tied.cumsum(0) <= count - int((flat < cut).sum())))
    return values * (~pruned).to(values.dtype).view_as(values)


@register("pruning")
class Pruning(Defense):
    deterministic = True

    def __init__(self, *, ratio: float, mode: str, scope: str) -> None:
        self.ratio, self.mode, self.scope = ratio, mode, scope

    def __call__(self, ctx: DefenseContext) -> Update:
        values = dict(ctx.model.named_parameters())
        gradient = ctx.true_gradient()
        scores = {}
        for k, g in gradient.items():
            w = values[k].detach()
            scores[k] = {"grad": g.abs(), "weight": w.abs(),
                         "weight_grad": (g * w).abs()}[self.mode]
        if self.scope == "layer":
            return Update({k: prune_smallest(scores[k], g, self.ratio)
                           for k, g in gradient.items()})
        flat = prune_smallest(torch.cat([s.flatten() for s in scores.values()]),
                              torch.cat([g.flatten() for g in gradient.values()]), self.ratio)
        sizes = [g.numel() for g in gradient.values()]
        return Update({k: part.view_as(g) for (k, g), part in
                       zip(gradient.items(), flat.split(sizes), strict=True)})

    def adaptive(self, trial: Update, ctx: DefenseContext, received: Update) -> Update:
        """``trial`` with the received upload's pruned (zero) entries zeroed."""
        return Update({k: g * (received[k] != 0).to(g.dtype) for k, g in trial.items()})
