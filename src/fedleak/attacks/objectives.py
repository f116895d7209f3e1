"""What the optimisation attacks minimise: a gradient distance plus weighted regularisers,
each chosen by name from a registry with one call signature (the protocol of breaching's
``objectives.py`` and ``regularizers.py``).

Distances ``(trial, target) -> loss`` over lists of per-layer gradients:
    l2      squared L2 summed over layers (DLG, Zhu et al. 2019, Eq. 4)
    cosine  1 - <g, g'> / (||g|| ||g'||) over all layers at once (Inverting Gradients,
            Geiping et al. 2020, Eq. 4)
    ggl     per-layer squared L2, summed, divided by the number of layers (GGL, Li et al.
            2022, official code)
Regularisers ``(candidate) -> penalty`` of a :class:`Candidate`:
    tv     anisotropic total variation mean|dx| + mean|dy| (Geiping et al. Eq. 4)
    l2     the images' L2 norm (GIFD's ``image_norm``)
    kl     GGL's KL(z || N(0, 1)) from each latent row's mean and biased variance
The priors of one paper (GradInversion's per-pixel image norm, BatchNorm statistics and
group consistency; GIAS's BatchNorm term) stay with the attack that introduced them,
which adds them to the composed loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

Gradients = Sequence[torch.Tensor]


def l2_distance(trial: Gradients, target: Gradients) -> torch.Tensor:
    return sum(((a - b) ** 2).sum() for a, b in zip(trial, target))


def cosine_distance(trial: Gradients, target: Gradients) -> torch.Tensor:
    dot = sum((a * b).sum() for a, b in zip(trial, target))
    trial_norm = sum((a * a).sum() for a in trial).sqrt()
    target_norm = sum((b * b).sum() for b in target).sqrt()
    return 1 - dot / (trial_norm * target_norm + 1e-12)


def ggl_distance(trial: Gradients, target: Gradients) -> torch.Tensor:
    return sum(((a - b) ** 2).sum() for a, b in zip(trial, target)) / len(target)


DISTANCES: dict[str, Callable[[Gradients, Gradients], torch.Tensor]] = {
    "l2": l2_distance, "cosine": cosine_distance, "ggl": ggl_distance}


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


def _latent(candidate: Candidate) -> torch.Tensor:
    if candidate.latent is None:
        raise ValueError("the 'kl' regulariser needs a latent vector; this attack has none")
    return candidate.latent


REGULARIZERS: dict[str, Callable[[Candidate], torch.Tensor]] = {
    "tv": lambda c: total_variation(c.images),
    "l2": lambda c: c.images.norm(),
    "kl": lambda c: kl_to_standard_normal(_latent(c)),
}

Objective = Callable[[Gradients, Gradients, Candidate], torch.Tensor]


def compose(distance: str, weights: Mapping[str, float] | None = None) -> Objective:
    """``distance(trial, target) + sum of weight * regulariser(candidate)``, in the order of
    ``weights``: regulariser name -> weight."""
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {sorted(DISTANCES)}, got {distance!r}")
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(REGULARIZERS))
    if unknown:
        raise ValueError(f"unknown regulariser(s) {unknown}; expected some of "
                         f"{sorted(REGULARIZERS)}")
    measure = DISTANCES[distance]
    terms = [(REGULARIZERS[name], weight) for name, weight in weights.items()]

    def objective(trial: Gradients, target: Gradients, candidate: Candidate) -> torch.Tensor:
        loss = measure(trial, target)
        for regularizer, weight in terms:
            loss = loss + weight * regularizer(candidate)
        return loss

    return objective
