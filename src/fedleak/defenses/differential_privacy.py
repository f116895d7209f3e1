"""Gradient perturbation with Gaussian or Laplace noise (Abadi et al., CCS 2016;
the DP baselines of DLG §5, Refiner §5.1 and CENSOR §V-A).

The update is clipped to global L2 norm ``clip`` (skipped when ``clip`` is None),
then every element gets i.i.d. noise: N(0, sigma^2) for ``dp_gaussian`` and
Laplace(0, scale) for ``dp_laplace``. As in those papers' baselines the noise
scale is absolute (not multiplied by the clip bound).
"""

from __future__ import annotations

import torch

from fedleak.defenses.base import Defense, DefenseContext, register, require_non_negative
from fedleak.fl.client import Update


def clip_global_norm(update: Update, bound: float | None) -> Update:
    if bound is None:
        return dict(update)
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in update.values())).item()
    factor = min(1.0, bound / (norm + 1e-12))
    return {k: g * factor for k, g in update.items()}


@register("dp_gaussian")
class GaussianNoise(Defense):
    knob = "sigma"

    def __init__(self, sigma: float = 1e-2, clip: float | None = 4.0) -> None:
        self.sigma = require_non_negative("sigma", sigma)
        self.clip = None if clip is None else require_non_negative("clip", clip)

    def __call__(self, ctx: DefenseContext) -> Update:
        clipped = clip_global_norm(ctx.true_gradient(), self.clip)
        return {k: g + self.sigma * torch.randn(g.shape, generator=ctx.generator).to(g.device)
                for k, g in clipped.items()}


@register("dp_laplace")
class LaplaceNoise(Defense):
    knob = "scale"

    def __init__(self, scale: float = 1e-2, clip: float | None = 4.0) -> None:
        self.scale = require_non_negative("scale", scale)
        self.clip = None if clip is None else require_non_negative("clip", clip)

    def __call__(self, ctx: DefenseContext) -> Update:
        clipped = clip_global_norm(ctx.true_gradient(), self.clip)
        out = {}
        for k, g in clipped.items():
            # Laplace(0, b) = b * (E1 - E2) with E1, E2 ~ Exp(1), drawn from the context generator.
            u = torch.rand((2, *g.shape), generator=ctx.generator).clamp_min(1e-12).to(g.device)
            out[k] = g + self.scale * (torch.log(u[0]) - torch.log(u[1]))
        return out
