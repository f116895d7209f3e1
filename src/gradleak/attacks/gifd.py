"""Gradient Inversion over Feature Domains, GIFD (Fang et al., ICCV 2023), as described in
CENSOR §II-B and §V-A (5).

Stage 0 searches the latent z of a pretrained generator G = B_K o ... o B_1; stage k >= 1
then optimises the intermediate feature f_k = B_k(f_{k-1}*) (the input of block k + 1)
through the remaining blocks, with the change of f_k from its stage start projected after
every step onto an l1 ball (per image; Duchi et al., ICML 2008) whose radius grows with
depth. Every stage minimises

    1 - cos(T(F(x)), g) + 1e-4 TV(x) + 1e-6 ||x||_2

(cosine over all layers, Inverting Gradients' Eq. 4; T as in ``gga``) with Adam, lr 0.1,
a 5% linear warm-up and a cosine decay over the last 25% of each stage. The output is the
stage image with the lowest gradient loss over all stages and restarts (the official
``choose_optimal`` returns the last restart's image, a bug not reproduced here).

Defaults follow the official BigGAN configuration: 1000 iterations per stage, 4 restarts,
z ~ N(0, I), the radius of feature stage k growing as r_1 + (k - 1) dr with dr = r_1 / 4
(2000, 2500, ... there). The blocks are the generator kind's (``prior.GeneratorPrior``):
for the DCGAN the ConvTranspose2d blocks of ``generator.net``, applied to z viewed as
(B, latent, 1, 1) (the latent and 3 feature stages); for StyleGAN2 the synthesis blocks
(the feature: the features and ToRGB skip a block takes, styles fixed at the latent
stage's W+ code); for BigGAN the stem's output and each layer's, the class conditioning
fixed. Absolute radii depend on the generator's feature sizes and scale,
so here a radius is a fraction of the l1 norm of the image's feature at the stage start:
0.1, 0.125, 0.15 by default (on digits with DP noise, larger radii let the later stages
fit the noise and lower PSNR). The official latent stage also renormalises z after each
step (its ``SphericalOptimizer``); that is not done here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from gradleak.attacks.base import Attack, register, stopper_from
from gradleak.attacks.gga import adaptive_transform, ramped
from gradleak.attacks.prior import as_prior, frozen_copy, rendered
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stage import Stage
from gradleak.attacks.victims import Victims
from gradleak.needs import Need


def project_l1_ball(v: torch.Tensor, radius: float | torch.Tensor) -> torch.Tensor:
    """Euclidean projection of each row ``v[i]`` onto the l1 ball of ``radius`` (a number or
    one radius per row), by the sort-based algorithm of Duchi et al. (ICML 2008)."""
    flat = v.flatten(1)
    radius = torch.as_tensor(radius, dtype=v.dtype, device=v.device).reshape(-1, 1)
    magnitude = flat.abs()
    inside = magnitude.sum(dim=1, keepdim=True) <= radius
    sorted_mag = magnitude.sort(dim=1, descending=True).values
    cumulative = sorted_mag.cumsum(dim=1)
    ranks = torch.arange(1, flat.shape[1] + 1, device=v.device, dtype=v.dtype)
    support = (sorted_mag - (cumulative - radius) / ranks > 0).sum(dim=1, keepdim=True)
    theta = (cumulative.gather(1, (support - 1).clamp(min=0)) - radius) / support.clamp(min=1)
    projected = flat.sign() * (magnitude - theta).clamp(min=0)
    return torch.where(inside, flat, projected).view_as(v)


def l1_projection(ratio: float):
    """``project(variable, start)``: each image's change from its stage start (P, B, ...)
    projected onto the l1 ball of ``ratio`` times the l1 norm of its start."""
    def project(variable: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        rows, origin = variable.flatten(0, 1), start.flatten(0, 1)
        radius = ratio * origin.flatten(1).abs().sum(1)
        return (origin + project_l1_ball(rows - origin, radius)).view_as(variable)

    return project


@register("gifd")
class GIFD(Attack):
    """Latent, then intermediate-feature search of a generator; see the module docstring."""

    needs = {"generator": Need("gan")}
    records_snapshots = False

    @classmethod
    def budget(cls, params: Mapping[str, Any]) -> int:
        """Every stage's steps: the latent search, then each feature block's."""
        return sum(params["steps"])

    @property
    def forms_gradients(self) -> bool:
        """An adaptive transformation forms each stacked problem's trial gradient."""
        return self.transform != "none"

    def __init__(self, *, generator: nn.Module, steps: Sequence[int], lr: float,
                 radii: Sequence[float], tv: float, image_norm: float, transform: str,
                 restarts: int, stopper: dict | None, seed: int = 0) -> None:
        self.generator = frozen_copy(as_prior(generator))
        self.latent_dim = self.generator.latent_dim
        stages = self.generator.stages
        steps = [int(s) for s in steps]
        if not 1 <= len(steps) <= stages or min(steps) < 1:
            raise ValueError(f"steps must list 1 to {stages} positive iteration counts "
                             f"(latent, then one per feature stage), got {list(steps)}")
        if len(radii) < len(steps) - 1 or any(r <= 0 for r in radii):
            raise ValueError(f"radii must give a positive radius for each of the "
                             f"{len(steps) - 1} feature stages, got {list(radii)}")
        self.steps, self.lr, self.radii = steps, lr, [float(r) for r in radii]
        self.tv, self.image_norm, self.transform = tv, image_norm, transform
        self.restarts, self.seed = restarts, seed
        self.stopper = stopper_from(stopper)

    def _stage(self, shape: tuple[int, int, int], k: int, iterations: int,
               ratio: float | None, fixed: int) -> Stage:
        """Stage 0 (``ratio`` None) searches z; feature stage k the input of block k + 1,
        the last ``fixed`` variables constants (the styles, BigGAN's conditioning)."""
        return Stage("cosine", self.lr, iterations, fixed=fixed,
                     render=rendered(self.generator.decoder(k), shape),
                     draw=self.generator.draw,
                     regularizers={"tv": self.tv, "l2": self.image_norm},
                     transform=None if self.transform == "none"
                     else partial(adaptive_transform, self.transform),
                     lr_factor=ramped(iterations), stopper=self.stopper,
                     project=None if ratio is None else l1_projection(ratio))

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        """Every stage of the chunk's problems, each from where the last ended; per victim
        the (restart, stage) image of lowest gradient distance."""
        shape = victims.observations[0].input_shape
        self.generator.to(victims.device)
        solutions = [victims.solve(self._stage(shape, 0, self.steps[0], None,
                                               self.generator.n_conditions))]
        grid = solutions[0].variables[0].shape[:3]
        for k, iterations in enumerate(self.steps[1:], start=1):
            with torch.no_grad():
                start = self.generator.advance(k, [v.flatten(0, 2)
                                                   for v in solutions[-1].variables])
            stage = self._stage(shape, k, iterations, self.radii[k - 1], len(start) - 1)
            solutions.append(victims.solve(stage, [v.unflatten(0, grid) for v in start]))
        images = [s.images() for s in solutions]  # each (V, R, B, C, H, W)
        losses = torch.stack([victims.distances(s.stage, x) for s, x in zip(solutions, images)],
                             dim=2).cpu()  # (V, R, stages)
        labels = victims.labels(solutions[0].stage)
        out = []
        for v in range(len(victims.observations)):
            restart, index = divmod(int(losses[v].flatten().argmin()), len(solutions))
            trace = [loss for s in solutions for loss in s.trace(v, restart)]
            out.append(Reconstruction(
                images[index][v, restart].clamp(0, 1), labels[v], trace, len(trace), 0.0,
                solutions[-1].stop_reasons[v][restart], restart=restart,
                extra={"stage": index, "stage_losses": losses[v, restart].tolist()}))
        return out
