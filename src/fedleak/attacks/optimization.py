"""The optimisation loop shared by all optimisation-based attacks (DESIGN §3).

Gradient distances: squared L2 summed over layers (DLG, Eq. 4 of Zhu et al.) and
the global cosine distance 1 - <g, g'> / (||g|| ||g'||) over all layers
(Inverting Gradients, Geiping et al., Eq. 4). Regulariser: anisotropic total
variation mean|dx| + mean|dy|. Optimisers: L-BFGS and Adam (optionally on the
sign of the gradient), a multi-step lr schedule, a box projection, restarts
(the lowest final loss wins) and an optional EPAFL stopper.

``optimize_vectorised`` runs many independent gradient-matching problems that
share one model (victims x restarts of one FL round) in lockstep: the trial
gradient, the distance and its gradient with respect to the images are
``torch.func.vmap``-ed over the problems instead of looped in Python (DESIGN §7).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import (
    functional_call,
    grad,
    grad_and_value,
    replace_all_batch_norm_modules_,
    vmap,
)

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


def clamp_unit(variables: list[torch.Tensor]) -> None:
    """Box projection of an image attack's first variable onto [0, 1]."""
    variables[0].clamp_(0, 1)


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
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def final_loss(self) -> float:
        return self.loss_trace[-1] if self.loss_trace else math.inf


def optimize(variables: list[torch.Tensor], objective: Callable[[], torch.Tensor], *,
             optimizer: str, lr: float, iterations: int, signed: bool = False,
             milestones: Sequence[float] = (), gamma: float = 0.1,
             project: Callable[[list[torch.Tensor]], None] | None = None,
             stopper: Stopper | None = None, snapshot_at: Collection[int] = (),
             render: Callable[[list[torch.Tensor]], torch.Tensor] | None = None) -> Trajectory:
    """Minimise ``objective()`` over ``variables`` in place; returns the trajectory.

    ``milestones`` are fractions of ``iterations`` at which the lr is multiplied by
    ``gamma``. A non-finite loss stops the run and restores the last finite iterate.
    ``render(variables)`` (the images, in [0, 1] after clamping) is recorded at each
    iteration of ``snapshot_at`` (0: the start); iterations after the run stopped early
    get its final images.
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
    snapshots: dict[int, torch.Tensor] = {}

    def snapshot(t: int) -> None:
        if t in snapshot_at:
            with torch.no_grad():
                snapshots[t] = render(variables).detach().clamp(0, 1).cpu()

    snapshot(0)
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
        snapshot(len(trace))
        if stopper is not None and (why := stopper.update(loss)) is not None:
            reason = why
            break
    if snapshot_at:
        final = render(variables).detach().clamp(0, 1).cpu()
        snapshots.update({t: final for t in snapshot_at if t > len(trace)})
    return Trajectory(variables, trace, len(trace), reason, snapshots)


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


@dataclass
class BatchedTrajectory:
    """The outcome of :func:`optimize_vectorised` for V victims x R restarts, on the device.

    ``images``: (V, R, B, C, H, W) final (last finite) iterates; ``loss_trace``:
    (iterations, V, R), of which problem (v, r) recorded the first
    ``iterations[v, r]`` entries (the finite ones before it diverged, if it did).
    """

    images: torch.Tensor
    loss_trace: torch.Tensor
    iterations: torch.Tensor
    diverged: torch.Tensor

    def final_loss(self) -> torch.Tensor:
        """(V, R) last recorded loss per problem; inf where none was recorded."""
        last = (self.iterations - 1).clamp(min=0).unsqueeze(0)
        final = self.loss_trace.gather(0, last).squeeze(0)
        return torch.where(self.iterations > 0, final, torch.full_like(final, math.inf))

    def best_restart(self) -> torch.Tensor:
        """(V,) index of the restart with the lowest final loss (the first one on ties)."""
        return self.final_loss().argmin(dim=1)


def _cross_entropy(module: nn.Module, buffers: dict[str, torch.Tensor],
                   params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
                   ) -> torch.Tensor:
    return F.cross_entropy(functional_call(module, (params, buffers), (x,)), y)


def functional_model(model: nn.Module) -> nn.Module:
    """The module that :func:`optimize_vectorised` calls: ``model`` itself unless it has
    BatchNorm layers in training mode, then a copy whose BatchNorm layers use the batch
    statistics without tracking running statistics (``replace_all_batch_norm_modules_``).

    This is the forward the per-victim path computes in training mode (each problem's
    own batch statistics) without updating ``model``'s running statistics in place,
    which ``vmap`` cannot do; in eval mode the running statistics are used as they are.
    """
    tracking = any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
                   and m.track_running_stats for m in model.modules())
    return replace_all_batch_norm_modules_(copy.deepcopy(model)) if tracking else model


def optimize_vectorised(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                        targets: dict[str, torch.Tensor], *, distance: str, tv: float,
                        lr: float, iterations: int, signed: bool = False,
                        milestones: Sequence[float] = (), gamma: float = 0.1,
                        boxed: bool = True, betas: tuple[float, float] = (0.9, 0.999),
                        eps: float = 1e-8) -> BatchedTrajectory:
    """Adam on V x R gradient-matching problems at once (Geiping et al., NeurIPS 2020, Eq. 4).

    Problem (v, r) minimises ``distance(grad_theta CE(model(x), labels[v]), targets[v])
    + tv * TV(x)`` over its images ``x``, starting from ``images[v, r]`` (V, R, B, C, H,
    W); ``labels`` is (V, B) and ``targets`` maps every parameter name of ``model`` to
    (V, *shape). The distance (``DISTANCES``) is taken over all layers flattened into one
    vector, the same value as over the list of layers. The V x R problems form one
    ``vmap`` (targets repeated per restart). The update is torch's Adam (on the sign of
    the gradient when ``signed``), the lr is multiplied by ``gamma`` at each fraction of
    ``iterations`` in ``milestones``, ``boxed`` projects onto [0, 1]. A problem whose
    loss or iterate turns non-finite gets its last finite iterate back and is frozen, as
    :func:`optimize` stops. The loss trace stays on the device (no host sync).
    """
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {sorted(DISTANCES)}, got {distance!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if images.ndim != 6:
        raise ValueError(f"images must be (victims, restarts, B, C, H, W), "
                         f"got shape {tuple(images.shape)}")
    victims, restarts = images.shape[:2]
    if labels.shape[:2] != (victims, images.shape[2]):
        raise ValueError(f"labels must start with (victims, B) = {(victims, images.shape[2])}, "
                         f"got shape {tuple(labels.shape)}")
    module = functional_model(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in module.named_buffers()}
    if set(targets) != set(params):
        raise ValueError(f"targets keys {sorted(targets)} do not match the model's "
                         f"parameters {sorted(params)}")
    bad = {n: tuple(t.shape) for n, t in targets.items() if t.shape != (victims, *params[n].shape)}
    if bad:
        raise ValueError(f"targets must be (victims={victims}, *parameter shape); got {bad}")
    measure = DISTANCES[distance]
    cross_entropy = partial(_cross_entropy, module, buffers)

    def matching(flat: torch.Tensor, target: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return measure([flat], [target]) + tv * total_variation(x)

    def objective(x: torch.Tensor, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        trial = grad(cross_entropy)(params, x, y)
        return matching(torch.cat([trial[n].flatten() for n in params]), target, x)

    trial_gradients = vmap(grad(cross_entropy), in_dims=(None, 0, 0))

    def autograd_step(x: torch.Tensor, y: torch.Tensor, target: torch.Tensor):
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            trial = trial_gradients(params, x, y)
            flat = torch.cat([trial[n].flatten(1) for n in params], dim=1)
            loss = vmap(matching)(flat, target, x)
            return torch.autograd.grad(loss.sum(), x)[0], loss.detach()

    # d objective / d x of every problem. Without BatchNorm batch statistics, regular
    # autograd through the vmap-ed trial gradients (1.25x faster on LeNet); with them,
    # all in torch.func, since autograd misses the dependence of the batch statistics
    # on x inside vmap (1e-3 relative gradient error on ResNet-10 in training mode).
    step = autograd_step if module is model else vmap(grad_and_value(objective))
    problems = victims * restarts

    def per_problem(t: torch.Tensor) -> torch.Tensor:
        """(V, ...) -> (V * R, ...), victim-major (a view when R is 1)."""
        return t.unsqueeze(1).expand(victims, restarts, *t.shape[1:]).flatten(0, 1)

    problem_labels = per_problem(labels)
    problem_targets = per_problem(torch.cat([targets[n].flatten(1) for n in params], dim=1))
    x = images.detach().flatten(0, 1).clone()
    exp_avg, exp_avg_sq = torch.zeros_like(x), torch.zeros_like(x)
    active = torch.ones(problems, dtype=torch.bool, device=x.device)
    counted = torch.zeros(problems, dtype=torch.long, device=x.device)
    trace = torch.empty(iterations, problems, dtype=x.dtype, device=x.device)
    per_image = (problems,) + (1,) * (x.ndim - 1)
    beta1, beta2 = betas
    decays = {int(m * iterations) for m in milestones}
    rate = lr
    for t in range(iterations):
        if t in decays:
            rate = rate * gamma
        g, loss = step(x, problem_labels, problem_targets)
        if signed:
            g = g.sign()
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / (1 - beta2 ** (t + 1)) ** 0.5).add_(eps)
        moved = x.addcdiv(exp_avg, denom, value=-rate / (1 - beta1 ** (t + 1)))
        active = active & torch.isfinite(loss) & torch.isfinite(moved).flatten(1).all(dim=1)
        x = torch.where(active.view(per_image), moved, x)
        if boxed:
            x = x.clamp(0, 1)
        trace[t] = loss
        counted += active
    grid = (victims, restarts)
    return BatchedTrajectory(x.unflatten(0, grid), trace.unflatten(1, grid),
                             counted.unflatten(0, grid), ~active.unflatten(0, grid))
