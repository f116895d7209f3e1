"""Deep Leakage from Gradients (DLG; Zhu, Liu and Han, NeurIPS 2019, Alg. 1, Eq. 4).

A dummy image and a dummy label (logits) are drawn from N(0, 1) and optimised
jointly with L-BFGS (lr 1, torch defaults) to minimise the squared L2 distance
between their gradient and the observed one, summed over layers, with
cross-entropy against softmax of the dummy label; 300 steps.

``restarts`` > 1 (default 1, as published) draws new initialisations and keeps
the one with the lowest final gradient distance: DLG fails mostly by stalling
from an unlucky initialisation (measured on digits: 20 of 30 single-init runs
succeed, EPAFL reports 0.66 on MNIST).
"""

from __future__ import annotations

import torch

from gradleak.attacks.base import Attack, register, stopper_from
from gradleak.attacks.stage import Stage
from gradleak.attacks.victims import Victims
from gradleak.types import Observation


def image_and_label_start(obs: Observation, rng: torch.Generator) -> list[torch.Tensor]:
    """A restart's dummy image and dummy label (logits), from N(0, 1)."""
    return [obs.randn((obs.batch_size, *obs.input_shape), rng),
            obs.randn((obs.batch_size, obs.num_classes), rng)]


@register("dlg")
class DLG(Attack):
    # Its L2 distance forms each stacked trial gradient, yet in lockstep (evaluated in the
    # caller's thread) stacking measured faster than the loop up to ResNet-18
    # (benchmarks/stacked_attacks.py, 2 threads, 3x32x32, 2 victims x 4 restarts: 1.42x on
    # LeNet, 1.51x and 1.48x on ResNet-10 of width 16 and 32, 1.10x on ResNet-18), so it
    # stacks on every model.
    forms_gradients = False
    optimizer = "lbfgs"

    def __init__(self, *, iterations: int, lr: float, restarts: int, stopper: dict | None,
                 seed: int = 0) -> None:
        self.iterations, self.lr, self.restarts, self.seed = iterations, lr, restarts, seed
        self.stopper = stopper_from(stopper)

    def stage(self, victims: Victims) -> Stage:
        return Stage("l2", self.lr, self.iterations, draw=image_and_label_start,
                     soft_labels=lambda variables: torch.softmax(variables[1], dim=-1),
                     optimizer=self.optimizer, stopper=self.stopper)
