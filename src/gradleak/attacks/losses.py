"""A stage's loss for P problems: their trial gradients stacked through
``StackedModel`` (:func:`stacked_loss`) or one problem at a time through autograd
(:func:`looped_loss`), each through its transformation (:func:`transformed`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from gradleak.attacks.bn_statistics import BNRecorder, batchnorm_layers
from gradleak.attacks.objectives import (
    DISTANCES,
    FORMED_DISTANCES,
    RESIDUAL_DISTANCES,
    Candidate,
    GradientProducts,
    penalty,
)
from gradleak.attacks.stacked_gradients import StackedModel
from gradleak.attacks.stage import (
    Loss,
    Prior,
    Transform,
)
from gradleak.attacks.unrolled import stacked_unrolled_updates, unrolled_update
from gradleak.types import Update


def transformed(transforms: Sequence[Transform], trials: Sequence[Update],
                images: torch.Tensor) -> list[Update]:
    """Problem p's trial gradient through ``transforms[p]``; transformations of one class
    that has a ``together`` (EOT's defense samples) run at once through it."""
    kinds = {type(t) for t in transforms}
    together = getattr(kinds.pop(), "together", None) if len(kinds) == 1 else None
    if together is not None:
        return together(transforms, trials, images)
    return [t(trial, x) for t, trial, x in zip(transforms, trials, images)]


Gradients = Mapping[str, torch.Tensor]


def measured(distance: str) -> Callable[[Gradients, Gradients], torch.Tensor]:
    """``distance`` of formed trial gradients (name -> (P, *shape)) from their targets
    (name -> (V, *shape)) -> (P,): a distance of formed gradients itself, else the
    distance of their products."""
    if distance in FORMED_DISTANCES:
        return FORMED_DISTANCES[distance]
    measure, residual = DISTANCES[distance], distance in RESIDUAL_DISTANCES
    return lambda trials, targets: measure(GradientProducts.formed(trials, targets, residual))


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
    uploads, formed (``unrolled.stacked_unrolled_updates``; no ``prior``); a distance of
    formed gradients (``objectives.FORMED_DISTANCES``) forms them always."""
    regularize, stacked = penalty(regularizers), StackedModel(model)
    of_formed, formed = measured(distance), distance in FORMED_DISTANCES
    measure, residual = DISTANCES.get(distance), distance in RESIDUAL_DISTANCES

    def loss(images: torch.Tensor, latent: torch.Tensor | None = None,
             labels: torch.Tensor | None = labels) -> torch.Tensor:
        if transforms is None and local is None and not formed:
            value = measure(stacked.products(images, labels, targets, residual))
        else:
            trial = stacked.gradients(images, labels, create_graph=torch.is_grad_enabled()) \
                if local is None else stacked_unrolled_updates(model, images, labels, *local)
            if transforms is not None:
                parts = [Update({k: g[p] for k, g in trial.items()}) for p in range(len(images))]
                parts = transformed(transforms, parts, images)
                trial = {k: torch.stack([part[k] for part in parts]) for k in trial}
            value = of_formed(trial, targets)
        if prior is not None:
            value = value + prior(images, stacked.batchnorm_statistics)
        if regularizers:
            value = value + regularize(Candidate(images, latent))
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
    measure, regularize = measured(distance), penalty(regularizers)
    norms = batchnorm_layers(model)

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
                misfit = measure({n: g.unsqueeze(0) for n, g in trial.items()},
                                 {n: t[own] for n, t in targets.items()})
                values.append(misfit[0])
                if norms:
                    moments.append(recorder.statistics())
        value = torch.stack(values) + regularize(Candidate(images, latent))
        if prior is not None:
            value = value + prior(images, lambda: [
                tuple(torch.stack([m[layer][i] for m in moments]) for i in range(2))
                for layer in range(len(norms))])
        return value

    return loss

