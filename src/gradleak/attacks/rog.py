"""ROG, Reconstruction from Obfuscated Gradients (Yue, Jin, Wong, Baron and Dai, "Gradient
Obfuscation Gives a False Sense of Security in Federated Learning", USENIX Security 2023,
§4), its optimisation as the official code runs it (KAI-YUE/rog, ``src/attack/attacker.py``).

The attacker searches a low-dimensional representation instead of the image: a
low-resolution image x_lr of the input's size over ``scale_factor`` (4 in the paper), drawn
from U[0, 1), decoded by bicubic interpolation U to the input's size, and fitted by
argmin_{x_lr} sum_l ||grad_l L(F(U(x_lr)), y) - g~_l||^2 to the received (obfuscated)
gradient g~: the decoder keeps the search away from the high-frequency patterns that fit the
obfuscation's error, which is where quantization, sparsification and noise leave a pixel
attack. Adam at lr 0.05 with cosine annealing to 0.05 x 0.1 over 100 iterations, no image
prior, one restart; labels as the other attacks infer them.

Departure: the paper's second step, post-processing U(x_lr) with networks pretrained on
ImageNet (a conditional generator, a denoiser and USRNet's super-resolution, averaged), is
not run: no pretrained weights can be fetched here. The reconstruction is U(x_lr) itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gradleak.attacks.base import Attack, register, stopper_from
from gradleak.attacks.objectives import RESIDUAL_DISTANCES
from gradleak.attacks.stage import Stage, Variables
from gradleak.attacks.victims import Victims
from gradleak.types import Observation

FINAL_LR_FACTOR = 0.1  # the official code's CosineAnnealingLR eta_min = 0.1 x lr


def cosine(iterations: int) -> Callable[[int], float]:
    """The lr factor of step t: cosine annealing from 1 to ``FINAL_LR_FACTOR``."""
    def factor(step: int) -> float:
        return FINAL_LR_FACTOR + (1 - FINAL_LR_FACTOR) * 0.5 * (
            1 + math.cos(math.pi * step / iterations))

    return factor


def low_resolution(shape: tuple[int, ...], scale_factor: int) -> tuple[int, int]:
    """The representation's height and width for an input (C, H, W): H and W over the
    factor, at least 1."""
    return max(1, round(shape[-2] / scale_factor)), max(1, round(shape[-1] / scale_factor))


@register("rog")
class ROG(Attack):
    def __init__(self, *, iterations: int, lr: float, scale_factor: int, distance: str,
                 boxed: bool, restarts: int, stopper: dict | None, seed: int = 0) -> None:
        self.iterations, self.lr, self.scale_factor = iterations, lr, scale_factor
        self.distance, self.boxed, self.restarts, self.seed = distance, boxed, restarts, seed
        self.stopper = stopper_from(stopper)

    @property
    def forms_gradients(self) -> bool:
        """An L2 distance forms each stacked trial gradient (cosine needs only products)."""
        return self.distance in RESIDUAL_DISTANCES

    def stage(self, victims: Victims) -> Stage:
        shape = victims.observations[0].input_shape
        size = tuple(shape[-2:])
        small = low_resolution(shape, self.scale_factor)

        def draw(obs: Observation, rng: torch.Generator) -> Variables:
            return [torch.rand((obs.batch_size, shape[0], *small), generator=rng
                               ).to(obs.device)]

        def render(variables: Variables) -> torch.Tensor:
            low = variables[0]
            images = F.interpolate(low.flatten(0, 1), size=size, mode="bicubic",
                                   align_corners=False)
            return images.unflatten(0, low.shape[:2])

        return Stage(self.distance, self.lr, self.iterations, draw=draw, render=render,
                     lr_factor=cosine(self.iterations), boxed=self.boxed, stopper=self.stopper)
