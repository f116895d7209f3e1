"""Victims x restarts of one FL round as one stacked problem (DESIGN §7).

``optimize_vectorised`` builds the objective of many independent gradient-matching
problems that share one model: their images run as one batch
(``stacked_gradients.StackedModel``) instead of looped in Python, and
``optimization.optimize`` steps the problems together. ``reconstruct_stacked`` runs an
attack's ``StackedAttack`` over its victims in chunks (``in_chunks``); trial-gradient
transformations (GGL's adaptive T per victim, EOT's samples per problem) are applied
through ``per_victim`` and ``per_problem``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import vmap
from tqdm import tqdm

from fedleak.attacks.base import Reconstruction
from fedleak.attacks.early_stopping import Stopper, copies
from fedleak.attacks.objectives import (
    RESIDUAL_DISTANCES,
    STACKED_DISTANCES,
    Candidate,
    GradientProducts,
    check_distance,
    penalty,
)
from fedleak.attacks.optimization import clamp_unit, optimize
from fedleak.attacks.stacked_gradients import StackedModel
from fedleak.types import Observation, Update


@dataclass
class BatchedTrajectory:
    """The outcome of :func:`optimize_vectorised` for V victims x R restarts, on the device.

    ``variables``: (V, R, ...) final (last finite) iterates; ``loss_trace``:
    (iterations, V, R), of which problem (v, r) recorded the first
    ``iterations[v, r]`` entries (the finite ones before it diverged or its stopper
    fired), and ``stop_reasons[v][r]`` when stoppers ran.
    """

    variables: torch.Tensor
    loss_trace: torch.Tensor
    iterations: torch.Tensor
    diverged: torch.Tensor
    stop_reasons: list[list[str]] | None = None

    def final_loss(self) -> torch.Tensor:
        """(V, R) last recorded loss per problem; inf where none was recorded."""
        last = (self.iterations - 1).clamp(min=0).unsqueeze(0)
        final = self.loss_trace.gather(0, last).squeeze(0)
        return torch.where(self.iterations > 0, final, torch.full_like(final, math.inf))

    def best_restart(self) -> torch.Tensor:
        """(V,) index of the restart with the lowest final loss (the first one on ties)."""
        return self.final_loss().argmin(dim=1)


Render = Callable[[torch.Tensor], torch.Tensor]
# A gradient transformation T: (trial gradient, trial images in [0, 1]) -> transformed gradient.
Transform = Callable[[Update, torch.Tensor], Update]
# restart r -> the transformation of that restart's trial gradients (EOT: its defense samples)
RestartTransforms = Callable[[int], Transform]
# T(trial gradients name -> (P, *shape), images (P, B, ...)) -> transformed trial gradients
StackedTransform = Callable[[dict[str, torch.Tensor], torch.Tensor], dict[str, torch.Tensor]]
# an attack's own term: (images (P, B, ...), the model that just ran them) -> (P,), called
# once per step (GradInversion's R_BN from StackedModel.batchnorm_statistics, its group term)
StackedPrior = Callable[[torch.Tensor, StackedModel], torch.Tensor]


def stacked_loss(model: nn.Module, labels: torch.Tensor | None,
                 targets: dict[str, torch.Tensor], *,
                 distance: str, regularizers: Mapping[str, float] | None = None,
                 transform: StackedTransform | None = None, prior: StackedPrior | None = None
                 ) -> Callable[..., torch.Tensor]:
    """``loss(images, latent=None, labels=labels)``: the (P,) objectives of P = V x R
    gradient-matching problems (victim-major) for their images (P, B, ...): ``distance``
    between each trial gradient (``labels`` (P, B) classes, or per call (P, B, classes)
    probabilities; changed by ``transform`` when given) and its victim's
    target (``targets``: every parameter name of ``model`` -> (V, *shape)), plus
    ``prior(images, stacked model)`` and the weighted ``regularizers`` of the images and
    the latent variable (P, ...), when given. See :func:`optimize_vectorised`."""
    check_distance(distance)
    regularize = penalty(regularizers)
    params = dict(model.named_parameters())
    if set(targets) != set(params):
        raise ValueError(f"targets keys {sorted(targets)} do not match the model's "
                         f"parameters {sorted(params)}")
    victims = len(next(iter(targets.values())))
    bad = {n: tuple(t.shape) for n, t in targets.items() if t.shape != (victims, *params[n].shape)}
    if bad:
        raise ValueError(f"targets must be (victims={victims}, *parameter shape); got {bad}")
    stacked = StackedModel(model)
    targets = {n: t.detach() for n, t in targets.items()}
    measure, residual = STACKED_DISTANCES[distance], distance in RESIDUAL_DISTANCES
    image_terms = vmap(lambda x: regularize(Candidate(x)))
    latent_terms = vmap(lambda x, z: regularize(Candidate(x, z)))

    def loss(images: torch.Tensor, latent: torch.Tensor | None = None,
             labels: torch.Tensor | None = labels) -> torch.Tensor:
        if transform is None:
            products = stacked.products(images, labels, targets, residual)
        else:
            trial = stacked.gradients(images, labels, create_graph=True)
            products = GradientProducts.formed(transform(trial, images), targets)
        value = measure(products)
        if prior is not None:
            value = value + prior(images, stacked)
        if regularizers:
            value = value + (image_terms(images) if latent is None
                             else latent_terms(images, latent))
        return value

    return loss


def optimize_vectorised(model: nn.Module, start: torch.Tensor, labels: torch.Tensor,
                        targets: dict[str, torch.Tensor], *, distance: str,
                        regularizers: Mapping[str, float] | None = None,
                        render: Render | None = None,
                        transform: StackedTransform | None = None,
                        prior: StackedPrior | None = None, lr: float, iterations: int,
                        signed: bool = False, milestones: Sequence[float] = (),
                        gamma: float = 0.1, lr_factor: Callable[[int], float] | None = None,
                        boxed: bool = True, project: Callable[[torch.Tensor], None] | None = None,
                        stoppers: Sequence[Stopper] | None = None,
                        betas: tuple[float, float] = (0.9, 0.999),
                        eps: float = 1e-8) -> BatchedTrajectory:
    """Adam on V x R gradient-matching problems at once (Geiping et al., NeurIPS 2020, Eq. 4).

    Problem (v, r) minimises ``distance(grad_theta CE(model(x), labels[v]), targets[v])
    + sum of weight * regulariser(x, z)`` (``objectives.penalty(regularizers)``), plus
    ``prior(images, stacked model)`` (P,) when given, over its variable z, starting from
    ``start[v, r]`` (V, R, B, ...): the images themselves (x = z), or latent codes that
    ``render`` maps to images ((P, B, ...) -> (P, B, C, H, W)). ``labels`` is (V, B) and
    ``targets`` maps every parameter name of ``model`` to (V, *shape). The distance
    (``objectives.DISTANCES``) is taken over all layers at once, from the trial gradients
    as ``transform`` (e.g. GGL's adaptive T) changes them when one is given: those are
    then formed in full.

    Each step: the V x R problems' images run as one batch through ``model``
    (:class:`~fedleak.attacks.stacked_gradients.StackedModel`), which reduces their
    trial gradients to the products the distance needs
    (``objectives.STACKED_DISTANCES``); autograd differentiates those and the
    regularisers with respect to the variables, the exact gradient of each problem's
    own objective. :func:`~fedleak.attacks.optimization.optimize` runs them as V x R
    stacked problems: Adam (on the sign of the gradient when ``signed``), the lr
    multiplied by ``gamma`` at each fraction of ``iterations`` in ``milestones`` or by
    ``lr_factor(t)`` at step t,
    ``boxed`` projecting onto [0, 1] and ``project`` (in place, on the (P, ...)
    variables) after every step; a problem that turns non-finite is frozen at its last
    finite iterate, as is one whose stopper fires (``stoppers``: one per problem,
    victim-major, or one per victim whose restarts form one joint problem, fed their
    summed loss). The loss trace stays on the device (no host sync without stoppers).
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if start.ndim < 4:
        raise ValueError(f"start must be (victims, restarts, B, ...), got shape "
                         f"{tuple(start.shape)}")
    victims, restarts = start.shape[:2]
    if labels.shape[:2] != (victims, start.shape[2]):
        raise ValueError(f"labels must start with (victims, B) = {(victims, start.shape[2])}, "
                         f"got shape {tuple(labels.shape)}")
    problem_labels = labels.unsqueeze(1).expand(victims, restarts, *labels.shape[1:]).flatten(0, 1)
    loss_of = stacked_loss(model, problem_labels, targets, distance=distance,
                           regularizers=regularizers, transform=transform, prior=prior)
    x = start.detach().flatten(0, 1).clone().requires_grad_(True)

    def projection(variables: list[torch.Tensor]) -> None:
        if boxed:
            clamp_unit(variables)
        if project is not None:
            project(variables[0])

    def batched() -> tuple[torch.Tensor, list[torch.Tensor]]:
        variable = x.detach().requires_grad_(True)
        loss = (loss_of(variable) if render is None
                else loss_of(render(variable), variable))
        (gradient,) = torch.autograd.grad(loss.sum(), variable)
        return loss.detach(), [gradient]

    run = optimize([x], batched, optimizer="adam", lr=lr, iterations=iterations,
                   signed=signed, milestones=milestones, gamma=gamma, lr_factor=lr_factor,
                   betas=betas, eps=eps, project=projection, stopper=stoppers)
    grid = (victims, restarts)
    reasons = None if run.stop_reasons is None else [
        run.stop_reasons[v * restarts:(v + 1) * restarts] for v in range(victims)]
    return BatchedTrajectory(x.detach().unflatten(0, grid), run.loss_trace.unflatten(1, grid),
                             run.iterations.unflatten(0, grid), run.diverged.unflatten(0, grid),
                             reasons)


@dataclass
class StackedAttack:
    """What an attack hands :func:`reconstruct_stacked`: one restart's start for a victim
    (drawn from the victim's generator), the victim's labels, the
    :func:`optimize_vectorised` keywords (``render`` among them for latent variables),
    the ``extra`` of every Reconstruction (with ``render``, also the victim's best
    ``latent``) and, when the trial gradients are transformed, the victim's transform
    (``transform(obs)``, applied to that victim's restarts stacked on the first dimension).
    ``prior(observations, restarts)`` gives the :data:`StackedPrior` of a chunk of victims
    (victim-major problems). ``choose(obs, images (R, B, ...), labels)`` makes a victim's
    restarts one joint problem (GradInversion's seeds): it returns the restart to keep
    and what it adds to ``extra``, and the loss trace is the restarts' sum. ``stopper``
    (EPAFL) is copied to every problem (with ``choose``: to every victim, fed the sum),
    each stopping on its own losses."""

    draw: Callable[[Observation, torch.Generator], torch.Tensor]
    labels: Callable[[Observation], torch.Tensor]
    settings: dict
    extra: dict = field(default_factory=dict)
    transform: Callable[[Observation], StackedTransform] | None = None
    prior: Callable[[list[Observation], int], StackedPrior] | None = None
    choose: Callable[[Observation, torch.Tensor, torch.Tensor], tuple[int, dict]] | None = None
    stopper: Stopper | None = None


def per_victim(transforms: list[StackedTransform], restarts: int) -> StackedTransform:
    """One transform for V victims x ``restarts`` problems (victim-major): victim v's
    ``transforms[v]`` applied to its own restarts."""
    def apply(trial: dict[str, torch.Tensor], images: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = [slice(v * restarts, (v + 1) * restarts) for v in range(len(transforms))]
        parts = [t({k: g[r] for k, g in trial.items()}, images[r])
                 for t, r in zip(transforms, rows)]
        return {k: torch.cat([part[k] for part in parts]) for k in trial}

    return apply


def per_problem(transforms: Sequence[Transform]) -> StackedTransform:
    """One transform for P problems: ``transforms[p]`` applied to problem p's own trial
    gradient and images (EOT's defense samples, which draw per problem)."""
    def apply(trial: dict[str, torch.Tensor], images: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = [t(Update({k: g[p] for k, g in trial.items()}), images[p])
                 for p, t in enumerate(transforms)]
        return {k: torch.stack([part[k] for part in parts]) for k in trial}

    return apply


def restart_transforms(trial_transforms: Sequence[RestartTransforms], restarts: int
                       ) -> StackedTransform:
    """The transform of V victims x ``restarts`` problems (victim-major) from each
    victim's :data:`RestartTransforms`."""
    return per_problem([of_restart(r) for of_restart in trial_transforms
                        for r in range(restarts)])


def check_one_each(trial_transforms: Sequence[RestartTransforms] | None,
                   observations: list[Observation]) -> None:
    """ValueError unless ``trial_transforms`` is None or gives one per observation."""
    if trial_transforms is not None and len(trial_transforms) != len(observations):
        raise ValueError(f"trial_transforms must give one per observation "
                         f"({len(observations)}), got {len(trial_transforms)}")


def first_of(observations: list[Observation]) -> Observation:
    """The first observation (ValueError for none): the one whose model, batch size and
    input shape every stacked victim shares."""
    if not observations:
        raise ValueError("reconstruct_many needs at least one observation, got none")
    return observations[0]


def reconstruct_stacked(observations: list[Observation], attack: StackedAttack, *,
                        restarts: int, seed: int, progress: str | None = None,
                        trial_transforms: Sequence[RestartTransforms] | None = None
                        ) -> list[Reconstruction]:
    """One Reconstruction per observation, victims x restarts optimised together by
    :func:`optimize_vectorised` (in chunks, :func:`in_chunks`): victim v draws its
    ``restarts`` starts in turn from a generator seeded ``seed + v``, as the per-victim
    attack built with that seed does, and keeps its restart of lowest final loss.
    ``trial_transforms[v]`` (EOT), when given, transforms victim v's restarts' trial
    gradients in place of ``attack.transform``."""
    check_one_each(trial_transforms, observations)

    def run(part: list[Observation], begin: int) -> list[Reconstruction]:
        transforms = (None if trial_transforms is None
                      else trial_transforms[begin:begin + len(part)])
        return _stacked_chunk(part, attack, restarts, seed + begin, transforms)

    return in_chunks(observations, restarts, progress, run)


def in_chunks(observations: list[Observation], restarts: int, progress: str | None,
              run: Callable[[list[Observation], int], list[Reconstruction]]
              ) -> list[Reconstruction]:
    """``run(chunk, index of its first victim)`` over the observations in chunks of
    ``StackedModel.problems_per_step`` problems of ``restarts`` each (ResNet-18 on 32x32
    images: 13, so one victim a chunk at 8 restarts), with a progress bar over victims
    labelled ``progress``; ``wall_time`` is then the victim's share of its chunk.

    The observations must share the model object, batch size and input shape."""
    first = first_of(observations)
    for v, obs in enumerate(observations):
        if obs.model is not first.model:
            raise ValueError(f"observation {v} has another model object; expected the "
                             "same model for every observation")
        if (obs.batch_size, obs.input_shape) != (first.batch_size, first.input_shape):
            raise ValueError(f"observation {v} has batch_size {obs.batch_size} and "
                             f"input_shape {obs.input_shape}; expected {first.batch_size} "
                             f"and {first.input_shape} like observation 0")
    probe = torch.zeros(first.batch_size, *first.input_shape, device=first.device)
    chunk = max(1, StackedModel(first.model).problems_per_step(probe) // restarts)
    out: list[Reconstruction] = []
    with tqdm(total=len(observations), desc=progress, unit="victim",
              disable=progress is None, leave=False) as bar:
        for begin in range(0, len(observations), chunk):
            part = observations[begin:begin + chunk]
            out += run(part, begin)
            bar.update(len(part))
    return out


def victim_targets(observations: list[Observation]) -> dict[str, torch.Tensor]:
    """The observed gradients of victims sharing one model: name -> (V, *shape)."""
    first = observations[0]
    return {n: torch.stack([obs.gradient[n].detach().to(first.device) for obs in observations])
            for n, _ in first.model.named_parameters()}


def _stacked_chunk(observations: list[Observation], attack: StackedAttack, restarts: int,
                   seed: int, trial_transforms: Sequence[RestartTransforms] | None
                   ) -> list[Reconstruction]:
    start = time.perf_counter()
    first = observations[0]

    def starts(v: int, obs: Observation) -> torch.Tensor:
        rng = torch.Generator().manual_seed(seed + v)  # as the per-victim attack
        return torch.stack([attack.draw(obs, rng) for _ in range(restarts)])

    labels = torch.stack([attack.labels(obs) for obs in observations])
    targets = victim_targets(observations)
    settings = dict(attack.settings)
    if trial_transforms is not None:
        settings["transform"] = restart_transforms(trial_transforms, restarts)
    elif attack.transform is not None:
        settings["transform"] = per_victim([attack.transform(obs) for obs in observations],
                                           restarts)
    if attack.prior is not None:
        settings["prior"] = attack.prior(observations, restarts)
    if attack.stopper is not None:  # with choose, a victim's restarts stop together
        settings["stoppers"] = copies(attack.stopper, len(observations) * (
            1 if attack.choose is not None else restarts))
    run = optimize_vectorised(first.model,
                              torch.stack([starts(v, o) for v, o in enumerate(observations)]),
                              labels, targets, **settings)
    render = attack.settings.get("render")
    if attack.choose is None:
        best = run.best_restart()
        chosen = run.variables[torch.arange(len(observations), device=best.device), best]
        with torch.no_grad():
            images = chosen if render is None else render(chosen)
        latents = None if render is None else chosen.detach().cpu()
        best = best.cpu()
        chosen_extra = [{} for _ in observations]
    else:
        with torch.no_grad():
            every = run.variables if render is None else render(run.variables)
        every = every.detach().clamp(0, 1)
        picks = [attack.choose(obs, every[v], labels[v]) for v, obs in enumerate(observations)]
        best = torch.tensor([r for r, _ in picks])
        images = every[torch.arange(len(observations)), best]
        latents = None if render is None else run.variables[torch.arange(len(observations)),
                                                            best.to(run.variables.device)].cpu()
        chosen_extra = [extra for _, extra in picks]
    # the one host sync of the chunk
    trace, counts, diverged = (t.cpu() for t in (run.loss_trace, run.iterations, run.diverged))
    share = (time.perf_counter() - start) / len(observations)
    out = []
    for v in range(len(observations)):
        r = int(best[v])
        extra = {**attack.extra, **chosen_extra[v],
                 "vectorised_problems": len(observations) * restarts}
        if latents is not None:
            extra["latent"] = latents[v]
        if attack.choose is None:  # the kept restart's own run
            steps, failed = int(counts[v, r]), bool(diverged[v, r])
            losses = trace[:steps, v, r]
        else:  # one joint problem: the restarts' summed loss, up to the first divergence
            steps, failed = int(counts[v].min()), bool(diverged[v].any())
            losses = trace[:steps, v].sum(1)
        reason = ("diverged" if failed else "max_iterations" if run.stop_reasons is None
                  else run.stop_reasons[v][r])
        out.append(Reconstruction(images[v].detach().clamp(0, 1), labels[v], losses.tolist(),
                                  steps, share, reason, restart=r, extra=extra))
    return out
