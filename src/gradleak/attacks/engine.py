"""The attack engine: an attack's optimisation, stated once as a :class:`Stage` (what it
optimises, its render, distance, regularisers, prior, projection, schedule, stopper), run
for the victims of one FL round stacked or one problem at a time. A
multi-stage attack solves a sequence of stages, each starting where the last one ended.

:func:`reconstruct_all` hands the attack its victims in chunks (:class:`Victims`) and picks
**stacked** where more than one problem runs, the model's parametrised layers stack
(``stacked_gradients.unsupported``) and, for an attack whose trial gradients are formed
(``forms_gradients``), forming them pays (``stacked_gradients.forming_pays``): the
P = victims x restarts problems' images then run as
one batch through ``StackedModel``, in chunks of ``StackedModel.problems_per_step``.
Otherwise each problem's trial gradient comes from autograd on the model, one victim a
chunk; ``attack(obs)`` is that with P = restarts. Either way Adam steps the P problems
together (element-wise, so each moves as if alone; one that diverges or whose stopper
fires is frozen there) and L-BFGS problems keep their own optimiser, evaluated together
(``lockstep.in_lockstep``). Victim v draws its restarts' starts in turn from a generator
seeded ``attack.seed + v``, as the attack built with that seed does on it alone. A victim
that is a sequence of uploads of its images (``gradient_sequence.ObservedSequence``, GIAS
App. D) has a stage's loss summed over its uploads, each on its images. A FedAvg upload
(``Observation.local_steps`` > 1) is matched by the trial's local steps, unrolled
(``unrolled``), formed when stacked; one of several epochs attacked through per-epoch
copies (``epoch_copies.EpochCopies``) adds their prior and is merged at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap
from tqdm import tqdm

from gradleak.attacks.base import Reconstruction
from gradleak.attacks.bn_statistics import BNRecorder, batchnorm_layers, preserved_buffers
from gradleak.attacks.early_stopping import Stopper, copies
from gradleak.attacks.epoch_copies import EpochCopies, merged, order_invariant_prior
from gradleak.attacks.gradient_sequence import ObservedSequence, mismatch, models
from gradleak.attacks.label_inference import infer_labels
from gradleak.attacks.lockstep import in_lockstep
from gradleak.attacks.objectives import (
    DISTANCES,
    RESIDUAL_DISTANCES,
    Candidate,
    GradientProducts,
    penalty,
)
from gradleak.attacks.optimization import Objective, Trajectory, last_recorded, optimize
from gradleak.attacks.stacked_gradients import StackedModel, forming_pays, unsupported
from gradleak.attacks.unrolled import stacked_unrolled_updates, step_rows, unrolled_update
from gradleak.types import Observation, Update

ENGINES = ("auto", "stacked", "loop")
Variables = list[torch.Tensor]
# A gradient transformation T: (one problem's trial gradient, name -> (*shape), its images)
# -> the transformed gradient (GGL's adaptive T, estimated from the received gradient).
Transform = Callable[[Mapping[str, torch.Tensor], torch.Tensor], Mapping[str, torch.Tensor]]
# restart r -> the transformation of that restart's trial gradients (EOT's defense samples)
RestartTransforms = Callable[[int], Transform]
Moments = list[tuple[torch.Tensor, torch.Tensor]]
# an attack's own term: (images (P, B, ...), the BatchNorm input moments (P, C) of the last
# forward, computed when called) -> (P,); called once per evaluation
Prior = Callable[[torch.Tensor, Callable[[], Moments]], torch.Tensor]
# a misfit that is no gradient distance: one victim's cost of its restarts' images
# (R, B, C, H, W) -> (R,), differentiable in them (R-GAP's residual of a layer's system)
Cost = Callable[[torch.Tensor], torch.Tensor]
# (first victim of a chunk, how to attack the chunk) -> its reconstructions
Kept = Callable[[int, Callable[[], list[Reconstruction]]], list[Reconstruction]]
Loss = Callable[..., torch.Tensor]


@dataclass
class Stage:
    """One optimisation of an attack. P problems' variables are tensors (P, ...), the last
    ``fixed`` of them constants (GI-w's codes); ``draw(obs, rng)`` gives one restart's.
    ``render`` maps them to images (P, B, C, H, W) (None: the first variable is the images;
    a rendered stage's regularisers see its first variable as the latent). The loss is
    ``distance`` between each trial gradient (cross-entropy against ``labels(obs)`` or
    ``soft_labels(variables)``, changed by ``transform(obs)``) and ``target(obs)`` (default:
    the observed gradient), plus ``prior(observations, restarts)``'s term and the weighted
    ``regularizers``. A stage whose misfit is no gradient distance gives ``cost(obs)``, victim
    ``obs``'s :data:`Cost`, in place of the distance (``distance`` None; no trial gradient,
    so no labels, target, transformation or prior): its loss is that cost of the rendered
    images plus the regularisers. Adam (on the gradient's sign when ``signed``) or L-BFGS runs
    ``iterations`` at ``lr``, times 0.1 at each fraction in ``milestones`` or
    ``lr_factor(t)``; after each step ``boxed`` clamps the first variable to [0, 1] and
    ``project(variable, start)`` replaces it. ``stopper`` is copied to every problem, or
    with ``joint`` to every victim, whose restarts then form one problem (their sum)."""

    distance: str | None
    lr: float
    iterations: int
    draw: Callable[[Observation, torch.Generator], Variables] | None = None
    regularizers: Mapping[str, float] = field(default_factory=dict)
    render: Callable[[Variables], torch.Tensor] | None = None
    labels: Callable[[Observation], torch.Tensor] = infer_labels
    soft_labels: Callable[[Variables], torch.Tensor] | None = None
    target: Callable[[Observation], Mapping[str, torch.Tensor]] | None = None
    transform: Callable[[Observation], Transform] | None = None
    prior: Callable[[list[Observation], int], Prior] | None = None
    optimizer: str = "adam"
    signed: bool = False
    milestones: Sequence[float] = ()
    lr_factor: Callable[[int], float] | None = None
    boxed: bool = False
    project: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    stopper: Stopper | None = None
    joint: bool = False
    fixed: int = 0
    cost: Callable[[Observation], Cost] | None = None

    def __post_init__(self) -> None:
        if self.cost is not None:
            given = [name for name in ("distance", "soft_labels", "target", "transform", "prior")
                     if getattr(self, name) is not None]
            if given:
                raise ValueError(f"a stage with a cost has no trial gradient; expected no "
                                 f"{', '.join(given)}, got {given[0]} {getattr(self, given[0])!r}")
            return
        if self.distance not in DISTANCES:
            raise ValueError(f"distance must be one of {sorted(DISTANCES)}, got "
                             f"{self.distance!r}")

    def images(self, variables: Variables) -> torch.Tensor:
        """The images (N, B, C, H, W) of N problems' variables (each (N, ...))."""
        return variables[0] if self.render is None else self.render(variables)


@dataclass
class Solution:
    """A solved stage for V victims x R restarts: the final (last finite) ``variables``,
    each (V, R, ...); ``loss_trace`` (T, V, R), of which problem (v, r) recorded the first
    ``iterations[v, r]`` entries; why each stopped; the images at the asked iterations;
    ``evaluations`` (V, R): each problem's objective evaluations (``Trajectory``)."""

    stage: Stage
    variables: Variables
    loss_trace: torch.Tensor
    iterations: torch.Tensor
    stop_reasons: list[list[str]]
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)
    evaluations: torch.Tensor | None = None

    def final_loss(self) -> torch.Tensor:
        """(V, R) the last recorded loss of each problem; inf where none was recorded."""
        return last_recorded(self.loss_trace, self.iterations)

    def best_restart(self) -> torch.Tensor:
        """(V,) each victim's restart of lowest final loss (the first on ties)."""
        return self.final_loss().argmin(dim=1)

    def trace(self, victim: int, restart: int) -> list[float]:
        return self.loss_trace[:int(self.iterations[victim, restart]), victim, restart].tolist()

    def chosen(self, restarts: torch.Tensor) -> Variables:
        """The variables (V, ...) of restart ``restarts[v]`` of each victim v."""
        return [v[torch.arange(len(restarts), device=v.device), restarts.to(v.device)]
                for v in self.variables]

    def images(self) -> torch.Tensor:
        """The images (V, R, B, C, H, W) of every problem (not clamped)."""
        grid = self.variables[0].shape[:2]
        with torch.no_grad():
            return self.stage.images([v.flatten(0, 1) for v in self.variables]).unflatten(0, grid)


def transformed(transforms: Sequence[Transform], trials: Sequence[Update],
                images: torch.Tensor) -> list[Update]:
    """Problem p's trial gradient through ``transforms[p]``; transformations of one class
    that has a ``together`` (EOT's defense samples) run at once through it."""
    kinds = {type(t) for t in transforms}
    together = getattr(kinds.pop(), "together", None) if len(kinds) == 1 else None
    if together is not None:
        return together(transforms, trials, images)
    return [t(trial, x) for t, trial, x in zip(transforms, trials, images)]


def stacked_loss(model: nn.Module, labels: torch.Tensor | None,
                 targets: dict[str, torch.Tensor], *, distance: str,
                 regularizers: Mapping[str, float] | None = None,
                 transforms: Sequence[Transform] | None = None, prior: Prior | None = None,
                 local: tuple[list[slice], float] | None = None) -> Loss:
    """``loss(images, latent=None, labels=labels)`` -> (P,): the stage loss of P = V x R
    problems (victim-major; ``targets``: name -> (V, *shape)) whose images (P, B, ...) run
    as one batch through ``model`` (:class:`StackedModel`; ``transforms[p]``, the
    transformation of problem p, forms the trial gradients), differentiable in the images
    where grad mode is on; with ``local`` (each step's rows, lr) the trials are FedAvg
    uploads, formed (``unrolled.stacked_unrolled_updates``; no ``prior``)."""
    regularize, stacked = penalty(regularizers), StackedModel(model)
    measure, residual = DISTANCES[distance], distance in RESIDUAL_DISTANCES
    image_terms = vmap(lambda x: regularize(Candidate(x)))
    latent_terms = vmap(lambda x, z: regularize(Candidate(x, z)))

    def loss(images: torch.Tensor, latent: torch.Tensor | None = None,
             labels: torch.Tensor | None = labels) -> torch.Tensor:
        if transforms is None and local is None:
            products = stacked.products(images, labels, targets, residual)
        else:
            trial = stacked.gradients(images, labels, create_graph=torch.is_grad_enabled()) \
                if local is None else stacked_unrolled_updates(model, images, labels, *local)
            parts = [Update({k: g[p] for k, g in trial.items()}) for p in range(len(images))]
            parts = parts if transforms is None else transformed(transforms, parts, images)
            products = GradientProducts.formed(
                {k: torch.stack([part[k] for part in parts]) for k in trial}, targets, residual)
        value = measure(products)
        if prior is not None:
            value = value + prior(images, stacked.batchnorm_statistics)
        if regularizers:
            value = value + (image_terms(images) if latent is None
                             else latent_terms(images, latent))
        return value

    return loss


def looped_loss(model: nn.Module, labels: torch.Tensor | None,
                targets: dict[str, torch.Tensor], *, distance: str,
                regularizers: Mapping[str, float] | None = None,
                transforms: Sequence[Transform] | None = None, prior: Prior | None = None,
                local: tuple[list[slice], float] | None = None) -> Loss:
    """:func:`stacked_loss` one problem at a time, each trial gradient by autograd on
    ``model`` itself (``transforms[p]`` the transformation of problem p when given); with
    ``local`` (each step's rows, lr), each trial is the FedAvg upload
    (``unrolled.unrolled_update``)."""
    measure, regularize = DISTANCES[distance], penalty(regularizers)
    residual, norms = distance in RESIDUAL_DISTANCES, batchnorm_layers(model)

    def loss(images: torch.Tensor, latent: torch.Tensor | None = None,
             labels: torch.Tensor | None = labels) -> torch.Tensor:
        restarts = len(images) // len(next(iter(targets.values())))
        graph, values, moments = torch.is_grad_enabled(), [], []
        with BNRecorder(model) as recorder:
            for p, x in enumerate(images):
                with torch.enable_grad():
                    trial = Update.of(model, x, labels[p], create_graph=graph) \
                        if local is None else unrolled_update(model, x, labels[p], *local,
                                                              create_graph=graph)
                if transforms is not None:
                    trial = transforms[p](trial, x)
                own = slice(p // restarts, p // restarts + 1)
                products = GradientProducts.formed({n: g.unsqueeze(0) for n, g in trial.items()},
                                                   {n: t[own] for n, t in targets.items()},
                                                   residual)
                values.append(measure(products)[0] + regularize(
                    Candidate(x, None if latent is None else latent[p])))
                if norms:
                    moments.append(recorder.statistics())
        value = torch.stack(values)
        if prior is not None:
            value = value + prior(images, lambda: [
                tuple(torch.stack([m[layer][i] for m in moments]) for i in range(2))
                for layer in range(len(norms))])
        return value

    return loss


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

    def with_transforms(self, transforms: Sequence[RestartTransforms]) -> Victims:
        return Victims(self.observations, restarts=self.restarts, seed=self.seed,
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
                value = value + torch.stack([regularize(Candidate(
                    x, None if latent is None else latent[p])) for p, x in enumerate(images)])
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
    run = optimize(x, lambda: objective(x + constants), optimizer="adam", lr=stage.lr,
                   iterations=stage.iterations, signed=stage.signed,
                   milestones=stage.milestones, lr_factor=stage.lr_factor,
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


def image_start(obs: Observation, rng: torch.Generator) -> Variables:
    """A restart's images, from N(0, 1) (Inverting Gradients, iDLG, GI-x, GradInversion)."""
    return [obs.randn((obs.batch_size, *obs.input_shape), rng)]


class Attack:
    """An optimisation attack stated once: ``stage(victims)`` for one stage, or
    ``reconstruct(victims)`` for several; the engine decides how they run. Subclasses set
    ``restarts``, ``seed`` and ``stopper``; ``forms_gradients`` when each problem's trial
    gradient is formed (an L2 distance, a transformation) and stacking it was measured to
    pay only on small models, ``vectorisable = False`` to take victims one at a time
    (CMA-ES), ``records_snapshots = False`` when snapshots are not one stage's,
    ``sequences = True`` when its cost is its stages' on the victims' uploads alone (no
    reading of ``obs.gradient`` or ``obs.model`` of its own), so that on a sequence victim
    (``gradient_sequence.ObservedSequence``) it sums over the uploads; ``optimizer`` its
    stages' (what `gradleak estimate` prices an iteration as)."""

    restarts: int = 1
    optimizer: str = "adam"
    seed: int = 0
    stopper: Stopper | None = None
    forms_gradients: bool = False
    vectorisable: bool = True
    records_snapshots: bool = True
    sequences: bool = False

    @classmethod
    def budget(cls, params: Mapping[str, Any]) -> int:
        """Gradient-matching iterations of one restart on one victim, from the resolved
        parameters (what `gradleak estimate` prices, ``experiment.estimate``); an attack
        with several stages or none overrides it."""
        return params["iterations"]

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """ConfigError naming ``where`` (the parameters' key path) unless the resolved
        ``params`` fit the pipeline's ``config`` (a rule of this attack between its
        parameters and another section); before any job. None by default."""

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        """One Reconstruction per victim of the chunk, from the subclass's ``stage``."""
        return victims.reconstructions(victims.solve(self.stage(victims)))

    def __call__(self, obs: Observation, snapshots: Collection[int] = ()) -> Reconstruction:
        """Reconstruct one victim (its restarts stacked where that pays)."""
        return reconstruct_all(self, [obs], snapshots)[0]


def stacks(attack: Attack, observations: Sequence[Observation]) -> bool:
    """Whether the observations' problems run stacked (the module docstring's rules)."""
    first = observations[0]
    formed = attack.forms_gradients or first.local_steps > 1  # FedAvg: unrolled, formed
    # train-mode BatchNorm updates its running statistics, which vmap cannot do in place
    training_bn = first.local_steps > 1 and first.model.training and batchnorm_layers(first.model)
    return (len(observations) * attack.restarts > 1 and not unsupported(first.model)
            and (not formed or forming_pays(first.model)) and not training_bn
            and not _mixed(observations))


def _mixed(observations: Sequence[Observation]) -> str | None:
    """Why the observations cannot stack (another model object, batch size or input shape)."""
    first = observations[0]
    for v, obs in enumerate(observations):
        if obs.model is not first.model:
            return (f"observation {v} has another model object; expected the same model for "
                    "every observation")
        if (obs.batch_size, obs.input_shape) != (first.batch_size, first.input_shape):
            return (f"observation {v} has batch_size {obs.batch_size} and input_shape "
                    f"{obs.input_shape}; expected {first.batch_size} and "
                    f"{first.input_shape} like observation 0")
        if (obs.local_steps, obs.local_lr) != (first.local_steps, first.local_lr):
            return (f"observation {v} is an upload of {obs.local_steps} local steps at lr "
                    f"{obs.local_lr}; expected {first.local_steps} at {first.local_lr} like "
                    f"observation 0")
    return mismatch(observations)


def reconstruct_all(attack: Attack, observations: list[Observation],
                    snapshots: Collection[int] = (), progress: str | None = None,
                    engine: str = "auto", kept: Kept | None = None) -> list[Reconstruction]:
    """One Reconstruction per observation (victim), victim v attacked with seed
    ``attack.seed + v``: ``engine`` "auto" stacks where the module docstring's rules say it
    pays, "stacked" or "loop" forces one way. A progress bar (per chunk of victims, with an
    ETA) is labelled ``progress``; ``wall_time`` is a victim's share of its chunk.
    ``snapshots`` asks for the images at those iterations (single-stage attacks).
    ``kept(begin, run)``: the chunk of victims from ``begin`` as a killed job kept it, else
    ``run()`` (a job resumes: ``experiment.resume``)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if not observations:
        return []
    if snapshots and not attack.records_snapshots:
        raise ValueError(f"{type(attack).__name__} cannot record snapshots (they are one "
                         f"stage's); expected attack.outputs.snapshots: [] for it")
    if not attack.sequences and any(isinstance(o, ObservedSequence) for o in observations):
        raise ValueError(f"{type(attack).__name__} cannot attack a sequence of uploads (GIAS "
                         f"App. D); expected single uploads, or an attack whose cost sums over "
                         f"a sequence (inverting_gradients; gias, giml with sparsity 0)")
    if engine == "stacked" and (why := _mixed(observations)):
        raise ValueError(why)
    stacked = engine == "stacked" or (engine == "auto" and stacks(attack, observations))
    first = observations[0]
    chunk = 1
    if stacked and attack.vectorisable:
        probe = torch.zeros(first.batch_size, *first.input_shape, device=first.device)
        chunk = max(1, StackedModel(first.model).problems_per_step(probe) // attack.restarts)
    out: list[Reconstruction] = []
    with tqdm(total=len(observations), desc=progress, unit="victim",
              disable=progress is None, leave=False) as bar:
        for begin in range(0, len(observations), chunk):
            part = observations[begin:begin + chunk]

            def run(part=part, begin=begin) -> list[Reconstruction]:
                start = time.perf_counter()
                recs = attack.reconstruct(Victims(part, restarts=attack.restarts,
                                                  seed=attack.seed + begin, stacked=stacked,
                                                  snapshots=snapshots))
                share = (time.perf_counter() - start) / len(part)
                for rec in recs:
                    rec.wall_time = share
                    if stacked:
                        rec.extra["vectorised_problems"] = len(part) * attack.restarts
                return recs
            out += run() if kept is None else kept(begin, run)
            bar.update(len(part))
    return [merged(rec, obs.epochs) if isinstance(obs, EpochCopies) else rec
            for rec, obs in zip(out, observations)]

