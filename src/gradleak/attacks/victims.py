"""One chunk of victims as the engine hands it to an attack (:class:`Victims`): ``solve``
runs a stage for them, stacked or one problem at a time, Adam on every problem at once or
L-BFGS problems in lockstep, and returns its :class:`~gradleak.attacks.stage.Solution`."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from contextlib import ExitStack
from functools import partial

import torch
import torch.nn.functional as F

from gradleak.attacks.bn_statistics import preserved_buffers
from gradleak.attacks.early_stopping import copies
from gradleak.attacks.epoch_copies import EpochCopies, order_invariant_prior
from gradleak.attacks.gradient_sequence import ObservedSequence, models
from gradleak.attacks.lockstep import in_lockstep
from gradleak.attacks.losses import looped_loss, stacked_loss
from gradleak.attacks.objectives import (
    Candidate,
    penalty,
)
from gradleak.attacks.optimization import Objective, Trajectory, optimize
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stacked_gradients import StackedModel
from gradleak.attacks.stage import (
    Loss,
    RestartTransforms,
    Solution,
    Stage,
    Transform,
    Variables,
)
from gradleak.attacks.unrolled import step_rows
from gradleak.types import Observation


class Victims:
    """One chunk of victims sharing a model, as :func:`reconstruct_all` hands them to an
    attack: ``solve`` runs a :class:`Stage` for them (stacked when ``stacked``), victim v
    drawing from a generator seeded ``seed + v``; ``transforms[v]`` (EOT) replaces every
    stage's transformation of victim v's restarts."""

    def __init__(self, observations: Sequence[Observation], *, restarts: int, seed: int,
                 stacked: bool, transforms: Sequence[RestartTransforms] | None = None,
                 snapshots: Collection[int] = ()) -> None:
        self.observations, self.restarts, self.seed = list(observations), restarts, seed
        self.stacked, self.transforms, self.snapshots = stacked, transforms, tuple(snapshots)
        self.model, self.device = self.observations[0].model, self.observations[0].device
        self._sampled: dict[int, list[Transform]] = {}  # restarts -> EOT's, one per problem

    def with_transforms(self, transforms: Sequence[RestartTransforms],
                        observations: Sequence[Observation] | None = None) -> Victims:
        """These victims (or ``observations`` in their place) through ``transforms``."""
        return Victims(observations or self.observations, restarts=self.restarts, seed=self.seed,
                       stacked=self.stacked, transforms=transforms, snapshots=self.snapshots)

    def draw(self, draw: Callable[[Observation, torch.Generator], Variables]) -> Variables:
        """Each variable's starts (V, R, ...): victim v draws its restarts in turn."""
        drawn = []
        for v, obs in enumerate(self.observations):
            rng = torch.Generator().manual_seed(self.seed + v)
            drawn.append([draw(obs, rng) for _ in range(self.restarts)])
        return [torch.stack([torch.stack([start[i] for start in starts]) for starts in drawn])
                for i in range(len(drawn[0][0]))]

    def labels(self, stage: Stage) -> torch.Tensor:
        return torch.stack([stage.labels(obs) for obs in self.observations])

    def loss(self, stage: Stage, restarts: int | None = None, *, regularized: bool = True
             ) -> Loss:
        """The stage's ``loss(images (P, B, ...), latent=None, labels=...)`` -> (P,) for the
        victims x ``restarts`` problems, victim-major, stacked or one problem at a time as
        the chunk runs; without the regularisers and prior unless ``regularized``."""
        restarts, chosen = restarts or self.restarts, self.observations
        if stage.cost is not None:
            return self._cost_loss(stage, restarts, regularized)
        if isinstance(chosen[0], ObservedSequence):
            return self._sequence_loss(stage, restarts, regularized)
        labels = self.labels(stage).repeat_interleave(restarts, 0)
        targets = [stage.target(obs) if stage.target else obs.gradient for obs in chosen]
        targets = {n: torch.stack([t[n].detach().to(self.device) for t in targets])
                   for n, _ in self.model.named_parameters()}
        transforms = None if self.transforms is None else self._sample(restarts)
        if transforms is None and stage.transform is not None:
            transforms = [t for t in map(stage.transform, chosen) for _ in range(restarts)]
        settings = {"distance": stage.distance,
                    "regularizers": stage.regularizers if regularized else None,
                    "prior": stage.prior(chosen, restarts) if regularized and stage.prior
                    else None}
        first = chosen[0]  # a FedAvg upload: the client's steps unrolled in each trial
        copied = isinstance(first, EpochCopies)
        local = (step_rows(first.local_steps, first.local_batches, first.batch_size, copied),
                 first.local_lr) if first.local_steps > 1 else None
        stacked = self.stacked and not (local and settings["prior"])  # no stacked BN prior
        loss = (stacked_loss if stacked else looped_loss)(
            self.model, labels, targets, transforms=transforms, local=local, **settings)
        if not (copied and regularized and first.prior_weight):
            return loss
        return lambda images, *rest, **labels: loss(images, *rest, **labels) + \
            first.prior_weight * order_invariant_prior(images, first.epochs)

    def _cost_loss(self, stage: Stage, restarts: int, regularized: bool) -> Loss:
        """A cost stage's loss: victim v's ``stage.cost(obs)`` of its restarts' images (rows
        v R to (v + 1) R), plus each problem's regularisers when ``regularized``."""
        if self.transforms is not None:
            raise ValueError("a stage with a cost has no trial gradient for EOT's defense "
                             "samples to transform; expected a stage with a distance")
        costs = [stage.cost(obs) for obs in self.observations]
        regularize = penalty(stage.regularizers) if regularized and stage.regularizers else None

        def loss(images: torch.Tensor, latent: torch.Tensor | None = None,
                 **_: torch.Tensor) -> torch.Tensor:
            value = torch.cat([cost(part) for cost, part in zip(costs, images.split(restarts))])
            if regularize is not None:
                value = value + regularize(Candidate(images, latent))
            return value

        return loss

    def _sequence_loss(self, stage: Stage, restarts: int, regularized: bool) -> Loss:
        """GIAS App. D, min_x sum_t c(x[S_t]; theta_t, g_t): the sum over the victims'
        uploads t of the stage's loss of upload t (its model, gradient, labels,
        transformation and prior) at the images (and latent rows) of its subset S_t."""
        chosen = self.observations
        steps = [Victims([obs.steps[t] for obs in chosen], restarts=restarts, seed=self.seed,
                         stacked=self.stacked, transforms=self.transforms
                         ).loss(stage, restarts, regularized=regularized)
                 for t in range(len(chosen[0].steps))]
        subsets = [torch.tensor([obs.subsets[t] for obs in chosen], device=self.device
                                ).repeat_interleave(restarts, 0) for t in range(len(steps))]
        problem = torch.arange(len(chosen) * restarts, device=self.device).unsqueeze(1)

        def loss(images: torch.Tensor, latent: torch.Tensor | None = None,
                 **labels: torch.Tensor) -> torch.Tensor:
            total = images.new_zeros(len(images))
            for step, subset in zip(steps, subsets):
                own = {k: v[problem, subset] for k, v in labels.items()}
                total = total + step(images[problem, subset],
                                     None if latent is None else latent[problem, subset], **own)
            return total

        return loss

    def _preserved(self) -> ExitStack:
        """Every model's buffers restored on exit, a sequence's step models too (train-mode
        BatchNorm would update their running statistics)."""
        stack = ExitStack()
        for model in models(self.observations):
            stack.enter_context(preserved_buffers(model))
        return stack

    def _sample(self, restarts: int) -> list[Transform]:
        """EOT's transformations of the chunk's problems, made once per chunk."""
        if restarts not in self._sampled:
            self._sampled[restarts] = [of_restart(r) for of_restart in self.transforms
                                       for r in range(restarts)]
        return self._sampled[restarts]

    def solve(self, stage: Stage, starts: Variables | None = None) -> Solution:
        """Run ``stage`` from ``starts`` (each (V, R, ...); default: drawn by ``stage.draw``)."""
        starts = self.draw(stage.draw) if starts is None else starts
        loss = self.loss(stage, starts[0].shape[1])

        def objective(variables: Variables) -> torch.Tensor:  # (P,) of variables (P, ...)
            labels = {} if stage.soft_labels is None else {"labels": stage.soft_labels(variables)}
            return loss(stage.images(variables), None if stage.render is None else variables[0],
                        **labels)

        run = _lockstep if stage.optimizer == "lbfgs" else _together
        with self._preserved():
            return run(stage, objective, starts, self.snapshots)

    def distances(self, stage: Stage, images: torch.Tensor) -> torch.Tensor:
        """(V, R) the stage's gradient distance (after its transformation) or cost alone at
        images (V, R, B, ...): how attacks choose among restarts or stages."""
        loss = self.loss(stage, images.shape[1], regularized=False)
        with self._preserved():
            return loss(images.flatten(0, 1)).detach().unflatten(0, images.shape[:2])

    def scorer(self, stage: Stage, victim: int, restart: int
               ) -> Callable[[Variables], torch.Tensor]:
        """The stage's losses (N,) of N candidate variables (each (N, ...)) of one victim's
        restart, without gradients, at most ``problems_per_step`` at a time (CMA-ES)."""
        obs = self.observations[victim]
        sampled = None if self.transforms is None else self.transforms[victim](restart)
        candidate = None if sampled is None else [lambda _: sampled]  # every one is restart's
        probe = torch.zeros(obs.batch_size, *obs.input_shape, device=self.device)
        per_step = StackedModel(self.model).problems_per_step(probe) if self.stacked else None

        def score(candidates: Variables) -> torch.Tensor:
            out = []
            for part in zip(*(c.split(per_step or len(c)) for c in candidates)):
                loss = Victims([obs], restarts=len(part[0]), seed=self.seed, stacked=self.stacked,
                               transforms=candidate).loss(stage)
                with torch.no_grad(), preserved_buffers(self.model):
                    out.append(loss(stage.images(list(part)), None if stage.render is None
                                    else part[0]).detach())
            return torch.cat(out)

        return score

    def reconstructions(self, solution: Solution, extra: dict | None = None
                        ) -> list[Reconstruction]:
        """Each victim's restart of lowest final loss, as a Reconstruction; its
        ``extra["evaluations"]`` is the objective evaluations of all the victim's restarts
        (its cost on a per-victim clock, whatever else ran stacked beside it)."""
        stage, best = solution.stage, solution.best_restart()
        chosen = solution.chosen(best)
        with torch.no_grad():
            images = stage.images(chosen)
        labels = (self.labels(stage) if stage.soft_labels is None
                  else stage.soft_labels(chosen).argmax(-1))
        out = []
        for v in range(len(self.observations)):
            r = int(best[v])
            trace = solution.trace(v, r)
            spent = {} if solution.evaluations is None else {
                "evaluations": int(solution.evaluations[v].sum())}
            out.append(Reconstruction(images[v].detach().clamp(0, 1), labels[v], trace,
                                      len(trace), 0.0, solution.stop_reasons[v][r], restart=r,
                                      extra={**(extra or {}), **spent}, snapshots={
                                          t: s[v, r] for t, s in solution.snapshots.items()}))
        return out


def _together(stage: Stage, objective: Callable[[Variables], torch.Tensor], starts: Variables,
              snapshots: Collection[int]) -> Solution:
    """Adam on the P = V x R problems at once (each stopper, divergence, on its own)."""
    optimised = len(starts) - stage.fixed
    x = [s.detach().flatten(0, 1).clone().requires_grad_(True) for s in starts[:optimised]]
    constants = [s.detach().flatten(0, 1) for s in starts[optimised:]]
    origin = x[0].detach().clone()

    def projection(variables: Variables) -> None:
        if stage.boxed:
            variables[0].clamp_(0, 1)
        if stage.project is not None:
            variables[0].copy_(stage.project(variables[0], origin))

    grid = starts[0].shape[:2]
    run = optimize(x, lambda: objective(x + constants), optimizer=stage.optimizer, lr=stage.lr,
                   iterations=stage.iterations, signed=stage.signed, lookahead=stage.lookahead,
                   probe=stage.probe, milestones=stage.milestones, lr_factor=stage.lr_factor,
                   project=projection, snapshot_at=snapshots,
                   render=lambda variables: stage.images(variables + constants),
                   stoppers=copies(stage.stopper, grid[0] if stage.joint else grid.numel()))
    return _solution(stage, grid, [run], constants)


def _lockstep(stage: Stage, objective: Callable[[Variables], torch.Tensor], starts: Variables,
              snapshots: Collection[int]) -> Solution:
    """L-BFGS: every problem its own optimiser and stopper, their objectives evaluated
    together once all wait (:func:`~gradleak.attacks.lockstep.in_lockstep`)."""
    optimised = len(starts) - stage.fixed
    flat = [s.detach().flatten(0, 1) for s in starts]
    problems = [[s[p:p + 1].clone().requires_grad_(True) for s in flat[:optimised]]
                for p in range(len(flat[0]))]

    def evaluate() -> tuple[torch.Tensor, list[torch.Tensor]]:
        stacked = [torch.cat([p[i].detach() for p in problems]).requires_grad_(True)
                   for i in range(optimised)]
        value = objective(stacked + flat[optimised:])
        return value.detach(), list(torch.autograd.grad(value.sum(), stacked))

    def run(p: int, shared: Objective) -> Trajectory:
        fixed = [c[p:p + 1] for c in flat[optimised:]]
        return optimize(problems[p], shared, optimizer="lbfgs", lr=stage.lr,
                        iterations=stage.iterations, stoppers=copies(stage.stopper, 1),
                        snapshot_at=snapshots, render=lambda vs: stage.images(vs + fixed))

    # one problem in this thread: torch runs slower in another beside an idle one
    runs = ([run(0, evaluate)] if len(problems) == 1
            else in_lockstep([partial(run, p) for p in range(len(problems))], evaluate))
    return _solution(stage, starts[0].shape[:2], runs, flat[optimised:])


def _solution(stage: Stage, grid: torch.Size, runs: list[Trajectory], constants: Variables
              ) -> Solution:
    """The Solution of V x R = ``grid`` problems (victim-major) from their trajectories, of
    all the problems or of one problem each (traces padded with NaN)."""
    length = max(len(r.loss_trace) for r in runs)
    trace = torch.cat([F.pad(r.loss_trace, (0, 0, 0, length - len(r.loss_trace)), value=math.nan)
                       for r in runs], dim=1)
    variables = [torch.cat(parts) for parts in zip(*(r.variables for r in runs))] + constants
    reasons = [reason for r in runs for reason in r.stop_reasons]
    return Solution(stage, [v.detach().unflatten(0, grid) for v in variables],
                    trace.unflatten(1, grid).cpu(),
                    torch.cat([r.iterations for r in runs]).unflatten(0, grid).cpu(),
                    [reasons[v * grid[1]:(v + 1) * grid[1]] for v in range(grid[0])],
                    {t: torch.cat([r.snapshots[t] for r in runs]).unflatten(0, grid)
                     for t in runs[0].snapshots},
                    torch.cat([r.evaluations for r in runs]).unflatten(0, grid).cpu())

