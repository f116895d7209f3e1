"""Inverting Gradients (Geiping et al., NeurIPS 2020, §4, Eq. 4).

argmin_x 1 - <g(x), g> / (||g(x)|| ||g||) + lambda_TV TV(x) over the box [0, 1],
with the cosine taken over all layers at once. Adam (lr 0.1) on the sign of the
gradient, lr x 0.1 at 3/8, 5/8 and 7/8 of 24,000 iterations, x from N(0, 1),
lambda_TV = 1e-4, best of ``restarts`` by final loss. Labels: the observed ones
when the attacker knows them, else the iDLG rule (batch of one).
"""

from __future__ import annotations

import torch

from fedleak.attacks.base import Observation, Reconstruction, register, stopper_from
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.label_inference import idlg_label
from fedleak.attacks.optimization import (
    DISTANCES,
    best_of_restarts,
    optimize,
    total_variation,
)
from fedleak.fl.client import gradient

MILESTONES = (3 / 8, 5 / 8, 7 / 8)


def _clamp_unit(variables: list[torch.Tensor]) -> None:
    variables[0].clamp_(0, 1)


@register("inverting_gradients")
class InvertingGradients:
    def __init__(self, iterations: int = 24000, lr: float = 0.1, tv: float = 1e-4,
                 restarts: int = 1, signed: bool = True, boxed: bool = True,
                 distance: str = "cosine", seed: int = 0, stopper: dict | None = None) -> None:
        if distance not in DISTANCES:
            raise ValueError(f"distance must be one of {sorted(DISTANCES)}, got {distance!r}")
        if tv < 0:
            raise ValueError(f"tv must be >= 0, got {tv}")
        self.iterations, self.lr, self.tv, self.restarts = iterations, lr, tv, restarts
        self.signed, self.boxed, self.distance, self.seed = signed, boxed, distance, seed
        self.stopper = stopper_from(stopper)

    def __call__(self, obs: Observation, stopper: Stopper | None = None) -> Reconstruction:
        labels = obs.labels.to(obs.device) if obs.labels is not None else idlg_label(obs)
        target = obs.target_gradient()
        distance = DISTANCES[self.distance]
        gen = torch.Generator().manual_seed(self.seed)

        def run_once(_: int):
            x = obs.randn((obs.batch_size, *obs.input_shape), gen).requires_grad_(True)

            def objective() -> torch.Tensor:
                trial = gradient(obs.model, x, labels, create_graph=True)
                return distance(list(trial.values()), target) + self.tv * total_variation(x)

            return optimize([x], objective, optimizer="adam", lr=self.lr,
                            iterations=self.iterations, signed=self.signed,
                            milestones=MILESTONES, project=_clamp_unit if self.boxed else None,
                            stopper=stopper or self.stopper)

        best, index, seconds = best_of_restarts(run_once, self.restarts)
        return Reconstruction(best.variables[0].detach().clamp(0, 1), labels, best.loss_trace,
                              best.iterations, seconds, best.stop_reason, restart=index)
