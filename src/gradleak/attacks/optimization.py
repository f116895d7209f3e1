"""The optimisation loop shared by all optimisation-based attacks.

Optimisers: L-BFGS, Adam and AdamW (optionally on the sign of the gradient, optionally with
a look-ahead step), a multi-step or per-step lr schedule, a projection and optional EPAFL
stoppers. What is minimised comes
from ``objectives``.

``optimize`` is the one loop: the engine hands it a stage's variables and objective, one
problem or P independent problems stacked on the first dimension.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from gradleak.attacks.early_stopping import Stopper

OPTIMIZERS = {"lbfgs": torch.optim.LBFGS, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
PROBES = ("descent", "ascent")  # where the look-ahead step takes its second gradient


@dataclass
class Trajectory:
    """What :func:`optimize` did to P problems: ``loss_trace`` (T, P), of which problem p
    recorded the first ``iterations[p]`` (finite) entries; why each stopped; the rendered
    images (P, ...) at the asked iterations; ``evaluations`` (P,): how many times each
    problem's objective was evaluated (Adam: once an iteration; L-BFGS: every evaluation of
    its line search), a problem's cost in units of one gradient evaluation."""

    variables: list[torch.Tensor]
    loss_trace: torch.Tensor
    iterations: torch.Tensor
    stop_reasons: list[str]
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)
    evaluations: torch.Tensor | None = None


def last_recorded(trace: torch.Tensor, iterations: torch.Tensor) -> torch.Tensor:
    """Each problem's last recorded loss (``iterations``' shape) of a trace (T, ...); inf
    where none was recorded."""
    final = trace.gather(0, (iterations - 1).clamp(min=0).unsqueeze(0)).squeeze(0)
    return torch.where(iterations > 0, final, torch.full_like(final, math.inf))


Objective = Callable[[], "torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]"]


def _finite(loss: torch.Tensor, variables: list[torch.Tensor]) -> torch.Tensor:
    """(P,) whether each problem's loss and variables (P, ...) are finite."""
    ok = torch.isfinite(loss)
    for v in variables:
        ok = ok & torch.isfinite(v).view(len(loss), -1).all(dim=-1)
    return ok


def optimize(variables: list[torch.Tensor], objective: Objective, *,
             optimizer: str, lr: float, iterations: int, signed: bool = False,
             lookahead: float = 0.0, probe: str = "descent",
             milestones: Sequence[float] = (),
             lr_factor: Callable[[int], float] | None = None,
             project: Callable[[list[torch.Tensor]], None] | None = None,
             stoppers: Sequence[Stopper] | None = None,
             snapshot_at: Collection[int] = (),
             render: Callable[[list[torch.Tensor]], torch.Tensor] | None = None) -> Trajectory:
    """Minimise ``objective()`` over ``variables`` in place; returns the trajectory.

    ``objective()`` returns the losses (P,) of P problems stacked on every variable's first
    dimension (one problem: P = 1, variables of any shape), or those and each variable's
    gradient. Adam steps their sum; L-BFGS minimises one problem. A problem that turns
    non-finite is frozen at its last finite iterate (L-BFGS stops). ``lookahead`` alpha > 0
    (Adam, AdamW): each iteration steps, takes the gradient s1 at the point it reached, goes
    back and steps on (1 - alpha) s0 + alpha s1, s0 the gradient where it started (Fan et
    al.'s gradient regularisation as their artifact runs it, the optimiser's moments seeing
    both steps, as there). ``probe`` ``descent`` takes s1 where the step -eta d went (the
    artifact's; to first order s0 - eta H d, a look-ahead step), ``ascent`` as far the
    other way (s0 + eta H d: the finite-difference gradient of a penalty on the gradient's
    norm, as Zhao et al., ICML 2022, approximate it). The lr is multiplied by
    0.1 at each fraction of ``iterations`` in ``milestones``, or by ``lr_factor(t)``;
    ``signed`` steps on the gradient's sign; ``project`` runs after every step. G
    ``stoppers`` (G dividing P): stopper g is fed the summed loss of the g-th run of P / G
    problems (one host sync a step); those whose stopper fires keep that iterate and stop
    counting, and the loop ends once none runs. ``render(variables)`` (clamped to [0, 1])
    is recorded at the iterations in ``snapshot_at`` (0: the start; after an early stop,
    the final images)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if probe not in PROBES:
        raise ValueError(f"probe must be one of {list(PROBES)}, got {probe!r}")
    if lookahead and optimizer == "lbfgs":
        raise ValueError(f"a look-ahead step (lookahead {lookahead}) is Adam's; expected "
                         f"optimizer 'adam' or 'adamw', got 'lbfgs'")
    opt = OPTIMIZERS[optimizer](variables, lr=lr)
    if lr_factor is not None:
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    else:
        steps = sorted({int(m * iterations) for m in milestones})
        schedule = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=steps, gamma=0.1)
    for each in stoppers or []:
        each.reset()

    calls = 0

    def closure() -> torch.Tensor:
        nonlocal calls
        calls += 1
        opt.zero_grad()
        out = objective()
        loss, gradients = out if isinstance(out, tuple) else (
            out, torch.autograd.grad(out.sum(), variables))  # not into other leaves' .grad
        for v, g in zip(variables, gradients):  # contiguous: L-BFGS views it flat
            v.grad = (g.sign() if signed else g).contiguous()
        return loss.detach()

    trace: list[torch.Tensor] = []
    last_good = [v.detach().clone() for v in variables]
    active = diverged = None  # (P,): still optimised (finite, not stopped); turned non-finite
    counted = 0
    reasons = ["max_iterations"] * len(stoppers or [None])  # per stopper (or all problems)
    snapshots: dict[int, torch.Tensor] = {}

    def snapshot(t: int) -> None:
        if t in snapshot_at:
            with torch.no_grad():
                snapshots[t] = render(variables).detach().clamp(0, 1).cpu()

    snapshot(0)
    for _ in range(iterations):
        if optimizer == "lbfgs":
            loss = opt.step(closure)
            if len(loss) != 1:
                raise ValueError("L-BFGS minimises one problem; got a loss of shape "
                                 f"{tuple(loss.shape)} (use Adam for stacked problems)")
        else:
            loss = closure()
            if lookahead:
                _look_ahead(opt, variables, closure, lookahead, probe)
            opt.step()
        schedule.step()
        if stoppers is not None and len(loss) % len(stoppers):
            raise ValueError(f"{len(stoppers)} stoppers need a multiple of as many stacked "
                             f"problems, got a loss of shape {tuple(loss.shape)}")
        with torch.no_grad():
            finite = _finite(loss, variables)
            if active is None:
                active, diverged = torch.ones_like(finite), torch.zeros_like(finite)
            diverged = diverged | (active & ~finite)
            active = active & finite
            for v, good in zip(variables, last_good):
                v.copy_(torch.where(active.view(-1, *(1,) * (v.ndim - 1)), v, good))
            if project is not None:
                project(variables)
            for v, good in zip(variables, last_good):
                good.copy_(v)
        trace.append(loss)
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
        elif optimizer == "lbfgs" and not active.all():
            break
    if snapshot_at:
        final = render(variables).detach().clamp(0, 1).cpu()
        snapshots.update({t: final for t in snapshot_at if t > len(trace)})
    size = len(diverged) // len(reasons)
    return Trajectory(variables, torch.stack(trace), counted, [
        "diverged" if d else reasons[p // size] for p, d in enumerate(diverged.tolist())],
        snapshots, counted * (2 if lookahead else 1) if optimizer != "lbfgs"
        else torch.full_like(counted, calls))


def _look_ahead(opt: torch.optim.Optimizer, variables: list[torch.Tensor],
                closure: Callable[[], torch.Tensor], alpha: float, probe: str) -> None:
    """Step (``ascent``: and mirror the step through the start), evaluate the gradient
    there, go back: each variable's gradient becomes (1 - alpha) x its own + alpha x the
    probe point's."""
    start = [v.detach().clone() for v in variables]
    own = [v.grad for v in variables]
    opt.step()
    if probe == "ascent":
        with torch.no_grad():
            for v, origin in zip(variables, start):
                v.copy_(2 * origin - v)
    closure()
    with torch.no_grad():
        for v, origin, grad in zip(variables, start, own):
            v.copy_(origin)
            v.grad = (1 - alpha) * grad + alpha * v.grad
