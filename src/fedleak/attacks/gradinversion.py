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
from fedleak.types import Need, Observation, Update

MILESTONES = (3 / 8, 5 / 8, 7 / 8)


def bn_loss(trial: Statistics, target: Statistics, first_weight: float) -> torch.Tensor:
    """sum_l w_l (||mu_l - mu'_l||_2 + ||var_l - var'_l||_2), w_1 = ``first_weight``, else 1."""
    terms = [torch.linalg.vector_norm(m - tm) + torch.linalg.vector_norm(v - tv)
             for (m, v), (tm, tv) in zip(trial, target)]
    return first_weight * terms[0] + sum(terms[1:])


@register("gradinversion")
class GradInversion:
    needs = {"bn_proxy": Need("bn_proxy", when={"bn": ("proxy",)})}

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

    def __call__(self, obs: Observation, stopper: Stopper | None = None) -> Reconstruction:
        start = time.perf_counter()
        labels = infer_labels(obs)
        target = obs.target_gradient()
        bn_target = self._bn_target(obs)
        area = obs.input_shape[1] * obs.input_shape[2]
        loss_of = compose("l2", {"tv": self.tv})
        rng = torch.Generator().manual_seed(self.seed)
        x = obs.randn((self.restarts, obs.batch_size, *obs.input_shape), rng).requires_grad_(True)
        group_mean: torch.Tensor | None = None
        step = 0

        def one_seed(images: torch.Tensor, recorder: BNRecorder) -> torch.Tensor:
            trial = Update.of(obs.model, images, labels, create_graph=True)
            loss = loss_of(list(trial.values()), target, Candidate(images))
            loss = loss + self.image_norm * torch.linalg.vector_norm(images) / area
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
                if (self.restarts > 1 and self.group > 0 and step >= self.group_start
                        and (step - self.group_start) % self.group_every == 0):
                    group_mean = x.detach().mean(0)
                return sum(one_seed(x[r], recorder) for r in range(self.restarts))

            run = optimize([x], objective, optimizer="adam", lr=self.lr,
                           iterations=self.iterations, milestones=MILESTONES,
                           project=clamp_unit, stopper=stopper or self.stopper)
            images = x.detach().clamp(0, 1)
            scores = [float(l2_distance(list(Update.of(obs.model, images[r], labels).values()),
                                        target)) for r in range(self.restarts)]
        best = min(range(self.restarts), key=scores.__getitem__)
        return Reconstruction(images[best], labels, run.loss_trace, run.iterations,
                              time.perf_counter() - start, run.stop_reason, restart=best,
                              extra={"bn": self.bn, "restart_scores": scores,
                                     "restart_images": images})
