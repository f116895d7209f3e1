"""Gradient perturbation with Gaussian or Laplace noise (Abadi et al., CCS 2016;
the DP baselines of DLG §5, Refiner §5.1 and CENSOR §V-A).

The update is clipped to global L2 norm ``clip`` (skipped when ``clip`` is None),
then every element gets i.i.d. noise: N(0, sigma^2) for ``dp_gaussian`` and
Laplace(0, scale) for ``dp_laplace``. As in those papers' baselines the noise
scale is absolute (not multiplied by the clip bound). Defaults: sigma = scale =
0.01, clip 4 (CENSOR's clipping baseline).

The adaptive attacker (decision 0072) matches the expectation of the upload over the noise,
which for zero-mean noise is the clipped trial gradient itself: EOT over the defense's
randomness with its expectation taken exactly instead of from S draws. Sampled draws
(the measured alternative, docs/decisions/0073-dp-adaptive-expectation.md) add noise to
the trial that the upload's own noise does not cancel, and lose 2-5 dB to the plain
attack on the embedded default.
"""

from __future__ import annotations

import torch

from gradleak.defenses.base import Defense, DefenseContext, register
from gradleak.types import Update


def clip_global_norm(update: Update, bound: float | None) -> Update:
    if bound is None:
        return Update(update)
    factor = min(1.0, bound / (update.norm().item() + 1e-12))
    return update.map(lambda g: g * factor)


class ZeroMeanNoise(Defense):
    """Clipping, then zero-mean noise: the adaptive attacker's expectation is the clip."""

    deterministic = True
    clip: float | None

    def adaptive(self, trial: Update, ctx: DefenseContext, received: Update) -> Update:
        return clip_global_norm(trial, self.clip)


@register("dp_gaussian")
class GaussianNoise(ZeroMeanNoise):
    def __init__(self, *, sigma: float, clip: float | None) -> None:
        self.sigma, self.clip = sigma, clip

    def __call__(self, ctx: DefenseContext) -> Update:
        clipped = clip_global_norm(ctx.true_gradient(), self.clip)
        return clipped.map(lambda g: g + self.sigma * torch.randn(g.shape, generator=ctx.rng)
                           .to(g.device))


@register("dp_laplace")
class LaplaceNoise(ZeroMeanNoise):
    def __init__(self, *, scale: float, clip: float | None) -> None:
        self.scale, self.clip = scale, clip

    def __call__(self, ctx: DefenseContext) -> Update:
        def noisy(g: torch.Tensor) -> torch.Tensor:
            # Laplace(0, b) = b * (E1 - E2) with E1, E2 ~ Exp(1), drawn from the context's rng.
            u = torch.rand((2, *g.shape), generator=ctx.rng).clamp_min(1e-12).to(g.device)
            return g + self.scale * (torch.log(u[0]) - torch.log(u[1]))

        return clip_global_norm(ctx.true_gradient(), self.clip).map(noisy)
