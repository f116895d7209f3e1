"""The optimisation loop shared by all optimisation-based attacks (DESIGN §3).

Gradient distances: squared L2 summed over layers (DLG, Eq. 4 of Zhu et al.) and
the global cosine distance 1 - <g, g'> / (||g|| ||g'||) over all layers
(Inverting Gradients, Geiping et al., Eq. 4). Regulariser: anisotropic total
variation mean|dx| + mean|dy|. Optimisers: L-BFGS and Adam (optionally on the
sign of the gradient), a multi-step lr schedule, a box projection, restarts
(the lowest final loss wins) and an optional EPAFL stopper.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fedleak.attacks.early_stopping import Stopper

OPTIMIZERS = ("lbfgs", "adam")


def l2_distance(trial: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum(((a - b) ** 2).sum() for a, b in zip(trial, target))


def cosine_distance(trial: Sequence[torch.Tensor], target: Sequence[torch.Tensor]) -> torch.Tensor:
    dot = sum((a * b).sum() for a, b in zip(trial, target))
    trial_norm = sum((a * a).sum() for a in trial).sqrt()
    target_norm = sum((b * b).sum() for b in target).sqrt()
    return 1 - dot / (trial_norm * target_norm + 1e-12)


DISTANCES = {"l2": l2_distance, "cosine": cosine_distance}


def total_variation(x: torch.Tensor) -> torch.Tensor:
    dx = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean()
    dy = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean()
    return dx + dy


@dataclass
class Trajectory:
    variables: list[torch.Tensor]
    loss_trace: list[float]
    iterations: int
    stop_reason: str

    @property
    def final_loss(self) -> float:
        return self.loss_trace[-1] if self.loss_trace else math.inf


def optimize(variables: list[torch.Tensor], objective: Callable[[], torch.Tensor], *,
             optimizer: str, lr: float, iterations: int, signed: bool = False,
             milestones: Sequence[float] = (), gamma: float = 0.1,
             project: Callable[[list[torch.Tensor]], None] | None = None,
             stopper: Stopper | None = None) -> Trajectory:
    """Minimise ``objective()`` over ``variables`` in place; returns the trajectory.

    ``milestones`` are fractions of ``iterations`` at which the lr is multiplied by
    ``gamma``. A non-finite loss stops the run and restores the last finite iterate.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if optimizer == "lbfgs":
        opt = torch.optim.LBFGS(variables, lr=lr)
    else:
        opt = torch.optim.Adam(variables, lr=lr)
    steps = sorted({int(m * iterations) for m in milestones})
    schedule = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=steps, gamma=gamma)
    if stopper is not None:
        stopper.reset()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        if signed:
            for v in variables:
                v.grad.sign_()
        return loss

    trace: list[float] = []
    last_good = [v.detach().clone() for v in variables]
    reason = "max_iterations"
    for _ in range(iterations):
        if optimizer == "lbfgs":
            loss = float(opt.step(closure).detach())
        else:
            loss = float(closure().detach())
            opt.step()
        schedule.step()
        if not math.isfinite(loss) or not all(torch.isfinite(v).all() for v in variables):
            with torch.no_grad():
                for v, good in zip(variables, last_good):
                    v.copy_(good)
            reason = "diverged"
            break
        if project is not None:
            with torch.no_grad():
                project(variables)
        trace.append(loss)
        for v, good in zip(variables, last_good):
            good.copy_(v.detach())
        if stopper is not None and (why := stopper.update(loss)) is not None:
            reason = why
            break
    return Trajectory(variables, trace, len(trace), reason)


def best_of_restarts(run_once: Callable[[int], Trajectory], restarts: int
                     ) -> tuple[Trajectory, int, float]:
    """Run ``restarts`` independent trials; keep the one with the lowest final loss."""
    if restarts < 1:
        raise ValueError(f"restarts must be >= 1, got {restarts}")
    start = time.perf_counter()
    best, best_index = None, 0
    for index in range(restarts):
        trial = run_once(index)
        if best is None or trial.final_loss < best.final_loss:
            best, best_index = trial, index
    return best, best_index, time.perf_counter() - start
