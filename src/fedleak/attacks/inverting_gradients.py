"""Inverting Gradients (Geiping et al., NeurIPS 2020, §4, Eq. 4).

argmin_x 1 - <g(x), g> / (||g(x)|| ||g||) + lambda_TV TV(x) over the box [0, 1],
with the cosine taken over all layers at once. Adam (lr 0.1) on the sign of the
gradient, lr x 0.1 at 3/8, 5/8 and 7/8 of 24,000 iterations, x from N(0, 1),
lambda_TV = 1e-4, best of ``restarts`` by final loss. Labels: the observed ones
when the attacker knows them, else the iDLG rule (batch of one). A
``trial_transform`` (EOT) makes restart r's objective match T_r(g(x), x) to g.

``reconstruct_many`` attacks several victims of one round at once with
:func:`~fedleak.attacks.stacked_problems.reconstruct_stacked` (victims x restarts
as one batch, each with its own stopper); victim v draws its restarts from a generator
seeded ``seed + v``, so
it starts from the images that ``InvertingGradients(seed=seed + v)(obs)`` does, and with
``trial_transforms`` (EOT) victim v's restarts are transformed by ``trial_transforms[v]``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from fedleak.attacks.base import Reconstruction, register, stopper_from
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.label_inference import idlg_label
from fedleak.attacks.objectives import RESIDUAL_DISTANCES, Candidate, compose
from fedleak.attacks.optimization import best_of_restarts, clamp_unit, optimize
from fedleak.attacks.stacked_problems import RestartTransforms, StackedAttack, reconstruct_stacked
from fedleak.types import Observation, Update

MILESTONES = (3 / 8, 5 / 8, 7 / 8)


@register("inverting_gradients")
class InvertingGradients:

    def __init__(self, *, iterations: int, lr: float, tv: float, restarts: int, signed: bool,
                 boxed: bool, distance: str, stopper: dict | None, seed: int = 0) -> None:
        self.iterations, self.lr, self.tv, self.restarts = iterations, lr, tv, restarts
        self.signed, self.boxed, self.distance, self.seed = signed, boxed, distance, seed
        self.stopper = stopper_from(stopper)

    def __call__(self, obs: Observation, stopper: Stopper | None = None,
                 trial_transform: RestartTransforms | None = None,
                 snapshots: Collection[int] = ()) -> Reconstruction:
        labels = obs.labels.to(obs.device) if obs.labels is not None else idlg_label(obs)
        target = obs.target_gradient()
        names = [n for n, _ in obs.model.named_parameters()]
        loss_of = compose(self.distance, {"tv": self.tv})
        rng = torch.Generator().manual_seed(self.seed)

        def run_once(index: int):
            x = obs.randn((obs.batch_size, *obs.input_shape), rng).requires_grad_(True)
            transform = None if trial_transform is None else trial_transform(index)

            def objective() -> torch.Tensor:
                trial = Update.of(obs.model, x, labels, create_graph=True)
                if transform is not None:
                    trial = transform(trial, x)
                return loss_of([trial[n] for n in names], target, Candidate(x))

            return optimize([x], objective, optimizer="adam", lr=self.lr,
                            iterations=self.iterations, signed=self.signed,
                            milestones=MILESTONES, project=clamp_unit if self.boxed else None,
                            stopper=stopper or self.stopper, snapshot_at=snapshots,
                            render=lambda v: v[0])

        best, index, seconds = best_of_restarts(run_once, self.restarts)
        return Reconstruction(best.variables[0].detach().clamp(0, 1), labels, best.loss_trace,
                              best.iterations, seconds, best.stop_reason, restart=index,
                              snapshots=best.snapshots)

    @property
    def forms_gradients(self) -> bool:
        """An L2 distance forms each stacked problem's trial gradient (cosine needs only
        their products)."""
        return self.distance in RESIDUAL_DISTANCES

    def reconstruct_many(self, observations: list[Observation], progress: str | None = None,
                         trial_transforms: Sequence[RestartTransforms] | None = None
                         ) -> list[Reconstruction]:
        """One Reconstruction per observation, victims x restarts optimised together
        (:func:`~fedleak.attacks.stacked_problems.reconstruct_stacked`); victim v uses seed
        ``self.seed + v`` and ``trial_transforms[v]`` (EOT) when given, each problem with
        its own copy of the stopper."""
        settings = {"distance": self.distance, "regularizers": {"tv": self.tv}, "lr": self.lr,
                    "iterations": self.iterations, "signed": self.signed,
                    "milestones": MILESTONES, "boxed": self.boxed}
        return reconstruct_stacked(observations, StackedAttack(
            draw=lambda obs, rng: obs.randn((obs.batch_size, *obs.input_shape), rng),
            labels=lambda obs: (obs.labels.to(obs.device) if obs.labels is not None
                                else idlg_label(obs)),
            settings=settings, stopper=self.stopper), restarts=self.restarts, seed=self.seed,
            progress=progress, trial_transforms=trial_transforms)
