"""Deep Leakage from Gradients (DLG; Zhu, Liu and Han, NeurIPS 2019, Alg. 1, Eq. 4).

A dummy image and a dummy label (logits) are drawn from N(0, 1) and optimised
jointly with L-BFGS (lr 1, torch defaults) to minimise the squared L2 distance
between their gradient and the observed one, summed over layers, with
cross-entropy against softmax of the dummy label; 300 steps.

``restarts`` > 1 (default 1, as published) draws new initialisations and keeps
the one with the lowest final gradient distance: DLG fails mostly by stalling
from an unlucky initialisation (measured on digits: 20 of 30 single-init runs
succeed, EPAFL reports 0.66 on MNIST).

Engine: the restarts of all victims run together (``reconstruct_many``), each its own
torch L-BFGS and stopper in a thread of its own, their objectives evaluated as one
stacked batch once every running problem waits for its own
(:func:`~fedleak.attacks.lockstep.restarts_in_lockstep`), on models up to 100k
parameters, where that was measured faster than the loop.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Collection

import torch

from fedleak.attacks.base import Reconstruction, register, stopper_from
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.lockstep import restarts_in_lockstep
from fedleak.attacks.objectives import l2_distance
from fedleak.attacks.optimization import Trajectory, best_of_restarts, optimize
from fedleak.attacks.stacked_problems import in_chunks, stacked_loss, victim_targets
from fedleak.types import Observation, Update


@register("dlg")
class DLG:
    forms_gradients = True  # L2: each stacked problem's trial gradient is formed
    # In lockstep (2 threads, 3x32x32, 2 victims x 4 restarts, benchmarks/stacked_attacks.py)
    # DLG/iDLG ran 1.20x/1.24x the loop on LeNet (16k parameters) and 0.93x on a ResNet-10
    # of 0.31M: each problem's own L-BFGS arithmetic is not stacked. Above this, they loop.
    stacked_parameters = 100_000

    def __init__(self, *, iterations: int, lr: float, restarts: int, stopper: dict | None,
                 seed: int = 0) -> None:
        self.iterations, self.lr, self.restarts, self.seed = iterations, lr, restarts, seed
        self.stopper = stopper_from(stopper)

    def _draw(self, obs: Observation, rng: torch.Generator) -> list[torch.Tensor]:
        """A restart's dummy image and dummy label (logits), from N(0, 1)."""
        return [obs.randn((obs.batch_size, *obs.input_shape), rng).requires_grad_(True),
                obs.randn((obs.batch_size, obs.num_classes), rng).requires_grad_(True)]

    def _optimize(self, variables: list[torch.Tensor], objective, stopper: Stopper | None = None,
                  snapshots: Collection[int] = ()) -> Trajectory:
        return optimize(variables, objective, optimizer="lbfgs", lr=self.lr,
                        iterations=self.iterations,
                        stopper=stopper or self.stopper,
                        snapshot_at=snapshots, render=lambda v: v[0])

    def __call__(self, obs: Observation, stopper: Stopper | None = None,
                 snapshots: Collection[int] = ()) -> Reconstruction:
        rng = torch.Generator().manual_seed(self.seed)
        target = obs.target_gradient()

        def run_once(_: int) -> Trajectory:
            x, y = variables = self._draw(obs, rng)

            def objective() -> torch.Tensor:
                trial = Update.of(obs.model, x, torch.softmax(y, dim=-1), create_graph=True)
                return l2_distance(list(trial.values()), target)

            return self._optimize(variables, objective, stopper, snapshots)

        best, index, seconds = best_of_restarts(run_once, self.restarts)
        x, y = best.variables
        return Reconstruction(x.detach().clamp(0, 1), y.detach().argmax(-1), best.loss_trace,
                              best.iterations, seconds, best.stop_reason, restart=index,
                              snapshots=best.snapshots)

    def reconstruct_many(self, observations: list[Observation], progress: str | None = None
                         ) -> list[Reconstruction]:
        """One Reconstruction per observation: every victim's restarts run their own L-BFGS
        (and stopper), their objectives evaluated as one stacked batch
        (:func:`~fedleak.attacks.lockstep.restarts_in_lockstep`); victim v with seed
        ``self.seed + v`` as the per-victim attack."""
        return in_chunks(observations, self.restarts, progress, self._lockstep_chunk)

    def _stacked_loss(self, observations: list[Observation]):
        """Stacked variables [images, label logits] (P, ...) -> the problems' L2 losses."""
        loss_of = stacked_loss(observations[0].model, None, victim_targets(observations),
                               distance="l2")
        return lambda v: loss_of(v[0], labels=torch.softmax(v[1], dim=-1))

    def _found_labels(self, run: Trajectory, obs: Observation) -> torch.Tensor:
        return run.variables[1].detach().argmax(-1)

    def _lockstep_chunk(self, observations: list[Observation], begin: int
                        ) -> list[Reconstruction]:
        start = time.perf_counter()
        chosen = restarts_in_lockstep(
            observations, restarts=self.restarts, seed=self.seed + begin, draw=self._draw,
            loss=self._stacked_loss(observations),
            run=lambda variables, objective: self._optimize(  # a stopper per problem
                variables, objective, copy.deepcopy(self.stopper)))
        share = (time.perf_counter() - start) / len(observations)
        return [Reconstruction(run.variables[0].detach().clamp(0, 1),
                               self._found_labels(run, obs), run.loss_trace, run.iterations,
                               share, run.stop_reason, restart=restart,
                               extra={"vectorised_problems": len(observations) * self.restarts})
                for (restart, run), obs in zip(chosen, observations)]
