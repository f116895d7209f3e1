"""GradInversion (Yin et al., "See through Gradients", CVPR 2021), as GIAS/GIFD run it.

Gradient matching with fidelity and group-consistency regularisers (Yin et al.,
§3; written as GIAS, Jeon et al., NeurIPS 2021, Eq. (2)-(3) with d the squared
L2 distance). For one seed x of B images with labels y::

    ||g(x, y) - g||^2                               squared L2, summed over all layers
    + a_tv  TV(x)                                   mean |dx| + mean |dy| (GIAS code)
    + a_l2  ||x||_2 / (H W)                         image norm
    + a_bn  sum_l w_l (||mu_l(x) - mu_l||_2 + ||var_l(x) - var_l||_2)
    + a_gr  ||x - E[x_group]||_2 / (H W)            group consistency

R_BN is the unnumbered equation of GIAS §4: mu_l, var_l are the per-channel mean
and biased variance of the input of the l-th BatchNorm layer (model order),
w_1 = 10 for the first layer and 1 for the others. Targets: ``bn="exact"`` the
client's batch statistics (``obs.bn_statistics``, BN_exact); ``bn="proxy"``
statistics of public images (``bn_proxy``, e.g. from
:func:`~fedleak.attacks.bn_statistics.dataset_statistics`, BN_proxy);
``bn="none"`` no BN term. The model runs in the mode it is given (train mode,
as the client computes its gradient).

Group consistency: the ``restarts`` seeds are optimised jointly (one Adam over
all of them; ``loss_trace`` and the stopper see the sum over seeds). From
iteration ``group_start`` on, refreshed every ``group_every`` iterations,
E[x_group] is the seeds' pixel-wise mean: GIAS/GIFD's "group lazy" regulariser.
Yin et al. also register the seeds to each other before averaging; that step
is left out. With one seed the term is off. The seed with the lowest final
gradient distance (no regulariser) is returned.

Engine: the seeds of all victims stack (``reconstruct_many``: R_BN from each stacked
problem's own BatchNorm inputs, the group mean per victim), on every model: measured
faster than the loop up to ResNet-18 although its L2 distance forms each problem's trial
gradient. A stacked seed that turns non-finite is frozen alone; the loop stops every seed.

Defaults: Adam, lr 0.01, 4,000 iterations, Euclidean gradient distance, label
inference (Refiner, Table 4); lr x 0.1 at 3/8, 5/8, 7/8 of the iterations,
a_tv = a_bn = a_gr = 1e-4, a_l2 = 1e-6, first-BN weight 10, group mean at
iteration 500 then every 100, pixels from N(0, 1) clamped to [0, 1] after every
step (GIAS/GIFD code, REFERENCE.md); 4 seeds (GIAS App. H: best of 4 random
instances). Labels: the known ones, else the B smallest row sums of the
last-layer weight gradient (:func:`~fedleak.attacks.label_inference.infer_labels`;
Yin et al. rank classes by the row minimum instead).
"""

from __future__ import annotations

import time

import torch

from fedleak.attacks.base import Reconstruction, register, stopper_from
from fedleak.attacks.bn_statistics import (
    BNRecorder,
    Statistics,
    batchnorm_layers,
    preserved_buffers,
)
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.label_inference import infer_labels
from fedleak.attacks.objectives import Candidate, compose, l2_distance
from fedleak.attacks.optimization import clamp_unit, optimize
from fedleak.attacks.stacked_gradients import StackedModel
from fedleak.attacks.stacked_problems import (
    StackedAttack,
    StackedPrior,
    first_of,
    reconstruct_stacked,
)
from fedleak.types import Need, Observation, Update

MILESTONES = (3 / 8, 5 / 8, 7 / 8)


def bn_loss(trial: Statistics, target: Statistics, first_weight: float) -> torch.Tensor:
    """sum_l w_l (||mu_l - mu'_l||_2 + ||var_l - var'_l||_2), w_1 = ``first_weight``, else 1;
    per problem for statistics stacked on leading dimensions ((P, C): a (P,) loss)."""
    terms = [torch.linalg.vector_norm(m - tm, dim=-1) + torch.linalg.vector_norm(v - tv, dim=-1)
             for (m, v), (tm, tv) in zip(trial, target)]
    return first_weight * terms[0] + sum(terms[1:])


def stacked_statistics(targets: list[Statistics], restarts: int) -> Statistics:
    """The victims' per-layer (mean, var) as (V * restarts, C), victim-major: the targets
    of their stacked problems."""
    return [tuple(torch.stack([stats[layer][i] for stats in targets])
                  .repeat_interleave(restarts, dim=0) for i in range(2))
            for layer in range(len(targets[0]))]


@register("gradinversion")
class GradInversion:
    needs = {"bn_proxy": Need("bn_proxy", when={"bn": ("proxy",)})}
    # Its L2 distance forms each stacked problem's trial gradient, yet stacking measured
    # faster than the loop on ResNet-18 too (benchmarks/stacked_attacks.py, 2 victims x 4
    # seeds: 1.27x with BN_exact, 1.20x without), so it stacks on every model.
    forms_gradients = False

    def __init__(self, *, iterations: int, lr: float, tv: float, bn_weight: float,
                 image_norm: float, group: float, bn: str, first_bn_weight: float,
                 restarts: int, group_start: int, group_every: int, stopper: dict | None,
                 bn_proxy: Statistics | None = None, seed: int = 0) -> None:
        if bn == "proxy" and not bn_proxy:
            raise ValueError("bn='proxy' needs bn_proxy: a list of (mean, var) per BatchNorm "
                             "layer computed on public data, got none")
        self.iterations, self.lr, self.restarts, self.seed = iterations, lr, restarts, seed
        self.tv, self.bn_weight, self.image_norm, self.group = tv, bn_weight, image_norm, group
        self.bn, self.bn_proxy, self.first_bn_weight = bn, bn_proxy, first_bn_weight
        self.group_start, self.group_every = group_start, group_every
        self.stopper = stopper_from(stopper)

    def _bn_target(self, obs: Observation) -> Statistics | None:
        """The BN statistics to match, checked against the model's BatchNorm layers."""
        if self.bn == "none":
            return None
        stats = obs.bn_statistics if self.bn == "exact" else self.bn_proxy
        if stats is None:
            raise ValueError("bn='exact' needs obs.bn_statistics (the client's batch statistics),"
                             " got None; use bn='proxy' or bn='none'")
        layers = batchnorm_layers(obs.model)
        if not layers:
            raise ValueError(f"bn={self.bn!r} needs a model with BatchNorm layers; "
                             f"{type(obs.model).__name__} has none, use bn='none'")
        if len(stats) != len(layers):
            raise ValueError(f"bn={self.bn!r}: expected {len(layers)} (mean, var) pairs, one per "
                             f"BatchNorm layer, got {len(stats)}")
        for i, ((mean, var), layer) in enumerate(zip(stats, layers)):
            if mean.shape != (layer.num_features,) or var.shape != (layer.num_features,):
                raise ValueError(f"bn={self.bn!r}: BatchNorm layer {i} has {layer.num_features} "
                                 f"channels, got statistics of shapes {tuple(mean.shape)} and "
                                 f"{tuple(var.shape)}")
        return [(m.detach().to(obs.device), v.detach().to(obs.device)) for m, v in stats]

    def _weights(self, obs: Observation) -> dict[str, float]:
        """The image regularisers: TV and the image norm per pixel position."""
        return {"tv": self.tv, "l2": self.image_norm / (obs.input_shape[1] * obs.input_shape[2])}

    def _group_refresh(self, step: int) -> bool:
        """Whether iteration ``step`` (from 1) recomputes the seeds' group mean."""
        return (self.restarts > 1 and self.group > 0 and step >= self.group_start
                and (step - self.group_start) % self.group_every == 0)

    def _best_seed(self, obs: Observation, images: torch.Tensor, labels: torch.Tensor
                   ) -> tuple[int, dict]:
        """The seed of ``images`` (R, B, ...) whose gradient is closest in squared L2 (no
        regulariser), and the scores and images of every seed."""
        target = obs.target_gradient()
        with preserved_buffers(obs.model):
            scores = [float(l2_distance(list(Update.of(obs.model, seed, labels).values()),
                                        target)) for seed in images]
        best = min(range(len(images)), key=scores.__getitem__)
        return best, {"restart_scores": scores, "restart_images": images}

    def __call__(self, obs: Observation, stopper: Stopper | None = None) -> Reconstruction:
        start = time.perf_counter()
        labels = infer_labels(obs)
        target = obs.target_gradient()
        bn_target = self._bn_target(obs)
        area = obs.input_shape[1] * obs.input_shape[2]
        loss_of = compose("l2", self._weights(obs))
        rng = torch.Generator().manual_seed(self.seed)
        x = torch.stack([obs.randn((obs.batch_size, *obs.input_shape), rng)  # seed by seed,
                         for _ in range(self.restarts)]).requires_grad_(True)  # as stacked
        group_mean: torch.Tensor | None = None
        step = 0

        def one_seed(images: torch.Tensor, recorder: BNRecorder) -> torch.Tensor:
            trial = Update.of(obs.model, images, labels, create_graph=True)
            loss = loss_of(list(trial.values()), target, Candidate(images))
            if bn_target is not None:
                loss = loss + self.bn_weight * bn_loss(recorder.statistics(), bn_target,
                                                       self.first_bn_weight)
            if group_mean is not None:
                loss = loss + self.group * torch.linalg.vector_norm(images - group_mean) / area
            return loss

        with preserved_buffers(obs.model), BNRecorder(obs.model) as recorder:
            def objective() -> torch.Tensor:
                nonlocal step, group_mean
                step += 1
                if self._group_refresh(step):
                    group_mean = x.detach().mean(0)
                return sum(one_seed(x[r], recorder) for r in range(self.restarts))

            run = optimize([x], objective, optimizer="adam", lr=self.lr,
                           iterations=self.iterations, milestones=MILESTONES,
                           project=clamp_unit, stopper=stopper or self.stopper)
        best, extra = self._best_seed(obs, x.detach().clamp(0, 1), labels)
        return Reconstruction(extra["restart_images"][best], labels, run.loss_trace,
                              run.iterations, time.perf_counter() - start, run.stop_reason,
                              restart=best, extra={"bn": self.bn, **extra})

    def reconstruct_many(self, observations: list[Observation], progress: str | None = None
                         ) -> list[Reconstruction]:
        """One Reconstruction per observation, the seeds of all victims optimised together
        (:func:`~fedleak.attacks.stacked_problems.reconstruct_stacked`): victim v with seed
        ``self.seed + v`` as the per-victim attack, its seeds one joint problem (loss
        trace summed over seeds, group mean per victim, best seed by gradient distance).
        Where a seed turns non-finite it alone is frozen at its last finite iterate (the
        per-victim attack stops every seed). A stopper sees the victim's summed loss and
        stops its seeds together, as in the loop."""
        first = first_of(observations)
        for obs in observations:  # bad BN statistics fail before any victim runs
            self._bn_target(obs)
        settings = {"distance": "l2", "regularizers": self._weights(first), "lr": self.lr,
                    "iterations": self.iterations, "milestones": MILESTONES}
        return reconstruct_stacked(observations, StackedAttack(
            draw=lambda obs, rng: obs.randn((obs.batch_size, *obs.input_shape), rng),
            labels=infer_labels, settings=settings, extra={"bn": self.bn},
            prior=self._stacked_prior, choose=self._best_seed, stopper=self.stopper),
            restarts=self.restarts, seed=self.seed, progress=progress)

    def _stacked_prior(self, observations: list[Observation], restarts: int) -> StackedPrior:
        """R_BN and the group term of victims x ``restarts`` stacked seeds (victim-major)."""
        targets = [self._bn_target(obs) for obs in observations]
        bn_target = None if targets[0] is None else stacked_statistics(targets, restarts)
        area = observations[0].input_shape[1] * observations[0].input_shape[2]
        group_mean: torch.Tensor | None = None
        step = 0

        def prior(images: torch.Tensor, stacked: StackedModel) -> torch.Tensor:
            nonlocal step, group_mean
            step += 1
            loss = images.new_zeros(len(images))
            if bn_target is not None:
                loss = loss + self.bn_weight * bn_loss(stacked.batchnorm_statistics(), bn_target,
                                                       self.first_bn_weight)
            if self._group_refresh(step):
                seeds = images.detach().unflatten(0, (-1, restarts))
                group_mean = seeds.mean(1, keepdim=True).expand_as(seeds).flatten(0, 1)
            if group_mean is not None:
                loss = loss + self.group * torch.linalg.vector_norm(
                    (images - group_mean).flatten(1), dim=1) / area
            return loss

        return prior
