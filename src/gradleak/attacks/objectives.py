"""What the optimisation attacks minimise: a gradient distance plus weighted regularisers,
each chosen by name from a registry with one call signature (the protocol of breaching's
``objectives.py`` and ``regularizers.py``).

Distances of P problems' trial gradients g' from their targets g, each ``(products) ->
(P,)`` of the problems' :class:`GradientProducts` (``stacked_gradients`` computes them
without forming every trial gradient where it can; ``GradientProducts.formed`` from formed
gradients):
    l2      squared L2 summed over layers (DLG, Zhu et al. 2019, Eq. 4)
    cosine  1 - <g, g'> / (||g|| ||g'||) over all layers at once (Inverting Gradients,
            Geiping et al. 2020, Eq. 4)
    ggl     per-layer squared L2, summed, divided by the number of layers (GGL, Li et al.
            2022, official code)
Regularisers ``(candidate) -> penalty`` of a :class:`Candidate`:
    tv     anisotropic total variation mean|dx| + mean|dy| (Geiping et al. Eq. 4)
    l2     the images' L2 norm (GIFD's ``image_norm``)
    kl     GGL's KL(z || N(0, 1)) from each latent row's mean and biased variance
    latent_norm  the sum of the latent rows' L2 norms (GIML, Jeon et al. 2021, Alg. 2 line 6)
The priors of one paper (GradInversion's per-pixel image norm, BatchNorm statistics and
group consistency; GIAS's BatchNorm term) stay with the attack that introduced them,
which adds them to the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch


@dataclass
class GradientProducts:
    """What the distances of P stacked problems need (every tensor (P,)): the inner
    product of each trial gradient with its target, their squared norms, and the summed
    squared difference (``residual_sq``, computed only for the L2 distances); ``layers``
    is the number of parameter tensors."""

    dot: torch.Tensor
    trial_sq: torch.Tensor
    target_sq: torch.Tensor
    residual_sq: torch.Tensor
    layers: int

    @classmethod
    def formed(cls, trial: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor],
               residual: bool) -> GradientProducts:
        """The products of formed trial gradients, name -> (P, *shape) for P = V x R
        problems (victim-major), with their targets, name -> (V, *shape); ``residual``: the
        summed squared differences, else the inner products and trial norms."""
        victims, problems = len(next(iter(targets.values()))), len(next(iter(trial.values())))
        dot = trial_sq = target_sq = residual_sq = torch.zeros(
            victims, problems // victims, dtype=next(iter(trial.values())).dtype,
            device=next(iter(trial.values())).device)
        for name, target in targets.items():
            expected = target.flatten(1).unsqueeze(2)  # (V, n, 1)
            t = trial[name].unflatten(0, (victims, -1)).flatten(2)  # (V, R, n)
            target_sq = target_sq + (torch.linalg.vector_norm(expected, dim=(1, 2)) ** 2
                                     ).unsqueeze(1)
            if residual:
                residual_sq = residual_sq + torch.linalg.vector_norm(
                    t - expected.transpose(1, 2), dim=2) ** 2
            else:
                dot = dot + (t @ expected).squeeze(2)
                trial_sq = trial_sq + torch.linalg.vector_norm(t, dim=2) ** 2
        return cls(dot.flatten(), trial_sq.flatten(), target_sq.flatten(),
                   residual_sq.flatten(), len(targets))


def cosine(products: GradientProducts) -> torch.Tensor:
    denominator = products.trial_sq.sqrt() * products.target_sq.sqrt() + 1e-12
    return 1 - products.dot / denominator


DISTANCES: dict[str, Callable[[GradientProducts], torch.Tensor]] = {
    "l2": lambda products: products.residual_sq,
    "cosine": cosine,
    "ggl": lambda products: products.residual_sq / products.layers,
}
RESIDUAL_DISTANCES = frozenset({"l2", "ggl"})  # from the formed gradients: exact near zero


@dataclass
class Candidate:
    """What the regularisers look at: the images fed to the model (N, C, H, W) and, for
    generative attacks, the latent vectors (N, latent)."""

    images: torch.Tensor
    latent: torch.Tensor | None = None


def total_variation(x: torch.Tensor) -> torch.Tensor:
    dx = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean()
    dy = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean()
    return dx + dy


def kl_to_standard_normal(z: torch.Tensor) -> torch.Tensor:
    mean = z.flatten(1).mean(dim=1)
    var = z.flatten(1).var(dim=1, unbiased=False)
    return -0.5 * (1 + torch.log(var + 1e-10) - mean**2 - var).sum()


def _latent(candidate: Candidate, name: str) -> torch.Tensor:
    if candidate.latent is None:
        raise ValueError(f"the {name!r} regulariser needs a latent vector; this attack has none")
    return candidate.latent


REGULARIZERS: dict[str, Callable[[Candidate], torch.Tensor]] = {
    "tv": lambda c: total_variation(c.images),
    "l2": lambda c: c.images.norm(),
    "kl": lambda c: kl_to_standard_normal(_latent(c, "kl")),
    "latent_norm": lambda c: _latent(c, "latent_norm").flatten(1).norm(dim=1).sum(),
}


def penalty(weights: Mapping[str, float] | None) -> Callable[[Candidate], torch.Tensor]:
    """``sum of weight * regulariser(candidate)`` in the order of ``weights`` (regulariser
    name -> weight); every name checked now."""
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(REGULARIZERS))
    if unknown:
        raise ValueError(f"unknown regulariser(s) {unknown}; expected some of "
                         f"{sorted(REGULARIZERS)}")

    def total(candidate: Candidate) -> torch.Tensor:
        value = candidate.images.new_zeros(())
        for name, weight in weights.items():
            value = value + weight * REGULARIZERS[name](candidate)
        return value

    return total
