"""The optimisation loop shared by all optimisation-based attacks (DESIGN §3).

Optimisers: L-BFGS and Adam (optionally on the sign of the gradient), a multi-step or
per-step lr schedule, a projection and optional EPAFL stoppers. What is minimised comes
from ``objectives``.

``optimize`` is the one loop: the engine hands it a stage's variables and objective, one
problem or P independent problems stacked on the first dimension.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from fedleak.attacks.early_stopping import Stopper

OPTIMIZERS = ("lbfgs", "adam")


@dataclass
class Trajectory:
    """What :func:`optimize` did. One problem: the finite losses, their count and why it
    stopped. P stacked problems: ``loss_trace`` (iterations, P), of which problem p
    recorded the first ``iterations[p]`` entries, ``diverged`` (P,) and, with stoppers,
    ``stop_reasons`` (P,)."""

    variables: list[torch.Tensor]
    loss_trace: list[float] | torch.Tensor
    iterations: int | torch.Tensor
    stop_reason: str
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)
    diverged: torch.Tensor | None = None
    stop_reasons: list[str] | None = None

    @property
    def final_loss(self) -> float:
        return self.loss_trace[-1] if self.loss_trace else math.inf


Objective = Callable[[], "torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]"]


def _finite(loss: torch.Tensor, variables: list[torch.Tensor]) -> torch.Tensor:
    """Whether each problem's loss and variables are finite: a bool of ``loss``'s shape
    (one problem: a 0-dim loss; P problems: (P,), the first dimension of every variable)."""
    ok = torch.isfinite(loss)
    for v in variables:
        ok = ok & torch.isfinite(v).flatten(loss.ndim).all(dim=-1)
    return ok


def optimize(variables: list[torch.Tensor], objective: Objective, *,
             optimizer: str, lr: float, iterations: int, signed: bool = False,
             milestones: Sequence[float] = (), lr_factor: Callable[[int], float] | None = None,
             project: Callable[[list[torch.Tensor]], None] | None = None,
             stopper: Stopper | Sequence[Stopper] | None = None,
             snapshot_at: Collection[int] = (),
             render: Callable[[list[torch.Tensor]], torch.Tensor] | None = None) -> Trajectory:
    """Minimise ``objective()`` over ``variables`` in place; returns the trajectory.

    ``objective()`` returns the loss, or the loss and each variable's gradient. A 0-dim
    loss is one problem, which stops at its first non-finite step; a (P,) loss is P
    problems stacked on every variable's first dimension (Adam only: it steps their sum),
    one that turns non-finite frozen at its last finite iterate. The lr is multiplied by
    0.1 at each fraction of ``iterations`` in ``milestones``, or by ``lr_factor(t)``;
    ``signed`` steps on the gradient's sign; ``project`` runs after every step. ``stopper``
    sees one problem's finite losses; P problems take G stoppers (G dividing P), stopper g
    fed the summed loss of the g-th run of P / G problems (one host sync a step): those
    whose stopper fires keep that iterate and stop counting, and the loop ends once none
    runs. ``render(variables)`` (clamped to [0, 1]) is recorded at the iterations in
    ``snapshot_at`` (0: the start; after an early stop, the final images)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if optimizer == "lbfgs":
        opt = torch.optim.LBFGS(variables, lr=lr)
    else:
        opt = torch.optim.Adam(variables, lr=lr)
    if lr_factor is not None:
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    else:
        steps = sorted({int(m * iterations) for m in milestones})
        schedule = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=steps, gamma=0.1)
    stoppers = list(stopper) if isinstance(stopper, Sequence) else None
    for each in stoppers or ([] if stopper is None else [stopper]):
        each.reset()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        out = objective()
        if isinstance(out, tuple):
            loss, gradients = out
            for v, g in zip(variables, gradients):
                v.grad = g
        else:
            loss = out
            (loss.sum() if loss.ndim else loss).backward()
        if signed:
            for v in variables:
                v.grad.sign_()
        return loss.detach()

    trace: list[torch.Tensor] = []
    last_good = [v.detach().clone() for v in variables]
    active = torch.tensor(True)  # still optimised: finite and not stopped
    diverged = torch.tensor(False)
    counted = 0
    reason = "max_iterations"
    reasons = None if stoppers is None else ["max_iterations"] * len(stoppers)
    snapshots: dict[int, torch.Tensor] = {}

    def snapshot(t: int) -> None:
        if t in snapshot_at:
            with torch.no_grad():
                snapshots[t] = render(variables).detach().clamp(0, 1).cpu()

    snapshot(0)
    for _ in range(iterations):
        if optimizer == "lbfgs":
            loss = opt.step(closure)
            if loss.ndim:
                raise ValueError("L-BFGS minimises one problem; got a loss of shape "
                                 f"{tuple(loss.shape)} (use Adam for stacked problems)")
        else:
            loss = closure()
            opt.step()
        schedule.step()
        if stoppers is not None and (loss.ndim != 1 or len(loss) % len(stoppers)):
            raise ValueError(f"{len(stoppers)} stoppers need a multiple of as many stacked "
                             f"problems, got a loss of shape {tuple(loss.shape)}")
        with torch.no_grad():
            finite = _finite(loss, variables)
            diverged = diverged.to(loss.device) | (active.to(loss.device) & ~finite)
            active = active.to(loss.device) & finite
            if loss.ndim == 0 and not active:
                for v, good in zip(variables, last_good):
                    v.copy_(good)
                reason = "diverged"
                break
            if loss.ndim:
                for v, good in zip(variables, last_good):
                    v.copy_(torch.where(active.view(-1, *(1,) * (v.ndim - 1)), v, good))
            if project is not None:
                project(variables)
            for v, good in zip(variables, last_good):
                good.copy_(v)
        trace.append(loss)
        if loss.ndim:  # stacked problems count their own iterations
            counted = counted + active.long()
        snapshot(len(trace))
        if stoppers is not None:
            groups = len(stoppers)
            running = active.view(groups, -1).any(1).tolist()
            values = loss.view(groups, -1).sum(1).tolist()
            for g, each in enumerate(stoppers):
                if running[g] and (why := each.update(values[g])) is not None:
                    reasons[g], running[g] = why, False
            active = active & torch.tensor(running, device=loss.device).repeat_interleave(
                len(loss) // groups)
            if not any(running):
                break
        elif stopper is not None and (why := stopper.update(float(loss))) is not None:
            reason = why
            break
    if snapshot_at:
        final = render(variables).detach().clamp(0, 1).cpu()
        snapshots.update({t: final for t in snapshot_at if t > len(trace)})
    if trace and trace[0].ndim:  # P problems: traces, counts and divergence stay tensors
        if reasons is not None:
            size = len(diverged) // len(reasons)
            reasons = ["diverged" if d else reasons[p // size]
                       for p, d in enumerate(diverged.tolist())]
        return Trajectory(variables, torch.stack(trace), counted, reason, snapshots, diverged,
                          reasons)
    return Trajectory(variables, torch.stack(trace).tolist() if trace else [], len(trace),
                      reason, snapshots)

