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
Distances of formed trial gradients, ``(trials, targets) -> (P,)`` (:data:`FORMED_DISTANCES`):
    partial           Fan et al.'s partial gradient matching (USENIX Security 2025), masked by
                      the trial gradient as their artifact does
    partial_received  the same, masked by the received gradient
    layer_cosine      1 - the mean over parameter tensors of each one's cosine: the cosine of
                      the layer-normalised gradients, what the adaptive attacker matches
                      through per-layer clipping, computed from a clean upload
Regularisers ``(candidate) -> (P,)`` of a :class:`Candidate` of P stacked problems, each
problem's penalty of its own images (and latent rows):
    tv     anisotropic total variation mean|dx| + mean|dy| (Geiping et al. Eq. 4)
    l2     the images' L2 norm (GIFD's ``image_norm``)
    kl     GGL's KL(z || N(0, 1)) from each latent row's mean and biased variance
    latent_norm  the sum of the latent rows' L2 norms (GIML, Jeon et al. 2021, Alg. 2 line 6)
The priors of one paper (GradInversion's per-pixel image norm, BatchNorm statistics and
group consistency; GIAS's BatchNorm term) stay with the attack that introduced them,
which adds them to the loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

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

KEPT, CORE = 0.5, 0.2  # the artifact's quantiles: the mask's, the cosine's inner mask's


def at_least_quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """(P, n) whether each entry is at least its row's q-quantile (``torch.quantile``'s
    linear one, up to the rounding of its interpolation: the comparison with the order
    statistic at or above it), by ``kthvalue``, which has no limit on a row's size."""
    k = math.ceil((values.shape[1] - 1) * q) + 1
    return values >= values.kthvalue(k, dim=1, keepdim=True).values


def partial_matching(trials: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor],
                     by_trial: bool = True) -> torch.Tensor:
    """Fan et al.'s partial gradient matching (the artifact's ``combine_loss``) of P = V x R
    trial gradients, name -> (P, *shape) (victim-major), from their targets, name ->
    (V, *shape): per parameter tensor, M keeps the entries of |g'| (the trial's; the
    target's unless ``by_trial``) at least its median, and the distance is
    mean|M g - M g'| (over the whole tensor) minus the cosine of M g and M g', taken over
    the entries of |M g| at least its 20th percentile; summed over the tensors. The masks
    are constants of each evaluation."""
    total = 0
    for name, target in targets.items():
        trial = trials[name].flatten(1)
        received = target.flatten(1).repeat_interleave(len(trial) // len(target), 0)
        chosen = at_least_quantile((trial if by_trial else received).detach().abs(), KEPT)
        trial, received = trial * chosen, received * chosen
        core = at_least_quantile(received.detach().abs(), CORE)
        t, g = trial * core, received * core
        cos = (t * g).sum(1) / (torch.linalg.vector_norm(t, dim=1) + 1e-8) / (
            torch.linalg.vector_norm(g, dim=1) + 1e-8)
        total = total + (trial - received).abs().mean(1) - cos
    return total


def layer_cosine(trials: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor]
                 ) -> torch.Tensor:
    """1 - the mean over parameter tensors of the cosine between trial and target (shapes
    as :func:`partial_matching`'s): the cosine of the gradients with every tensor scaled
    to norm 1."""
    total = 0
    for name, target in targets.items():
        trial = trials[name].flatten(1)
        received = target.flatten(1).repeat_interleave(len(trial) // len(target), 0)
        total = total + torch.nn.functional.cosine_similarity(trial, received, dim=1, eps=1e-12)
    return 1 - total / len(targets)


FORMED_DISTANCES: dict[str, Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]],
                                     torch.Tensor]] = {
    "partial": partial_matching,
    "partial_received": partial(partial_matching, by_trial=False),
    "layer_cosine": layer_cosine,
}


@dataclass
class Candidate:
    """What the regularisers look at, for P problems: the images each feeds the model
    (P, N, C, H, W) and, for generative attacks, its latent vectors (P, N, latent)."""

    images: torch.Tensor
    latent: torch.Tensor | None = None


def _mean(t: torch.Tensor) -> torch.Tensor:
    """(P,) each problem's mean of ``t`` (P, ...)."""
    return t.flatten(1).mean(1)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    dx = _mean((x[..., :, 1:] - x[..., :, :-1]).abs())
    dy = _mean((x[..., 1:, :] - x[..., :-1, :]).abs())
    return dx + dy


def kl_to_standard_normal(z: torch.Tensor) -> torch.Tensor:
    """Per problem, the sum over its latent rows (P, N, ...) of KL(row || N(0, 1))."""
    rows = z.flatten(2)
    var, mean = torch.var_mean(rows, dim=2, unbiased=False)
    return -0.5 * (1 + torch.log(var + 1e-10) - mean**2 - var).sum(1)


def _latent(candidate: Candidate, name: str) -> torch.Tensor:
    if candidate.latent is None:
        raise ValueError(f"the {name!r} regulariser needs a latent vector; this attack has none")
    return candidate.latent


REGULARIZERS: dict[str, Callable[[Candidate], torch.Tensor]] = {
    "tv": lambda c: total_variation(c.images),
    "l2": lambda c: c.images.flatten(1).norm(dim=1),
    "kl": lambda c: kl_to_standard_normal(_latent(c, "kl")),
    "latent_norm": lambda c: _latent(c, "latent_norm").flatten(2).norm(dim=2).sum(1),
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
        value = candidate.images.new_zeros(len(candidate.images))
        for name, weight in weights.items():
            value = value + weight * REGULARIZERS[name](candidate)
        return value

    return total
