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
:func:`~gradleak.attacks.bn_statistics.dataset_statistics`, BN_proxy);
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
step (GIAS's and GIFD's official code); 4 seeds (GIAS App. H: best of 4 random
instances). Labels: the known ones, else the B smallest row sums of the
last-layer weight gradient (:func:`~gradleak.attacks.label_inference.infer_labels`;
Yin et al. rank classes by the row minimum instead).
"""

from __future__ import annotations

import torch

from gradleak.attacks.base import Attack, register, stopper_from
from gradleak.attacks.bn_statistics import Statistics, bn_loss, checked, stacked_statistics
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stage import Prior, Stage, image_start
from gradleak.attacks.victims import Victims
from gradleak.needs import Need
from gradleak.types import Observation

MILESTONES = (3 / 8, 5 / 8, 7 / 8)


@register("gradinversion")
class GradInversion(Attack):
    needs = {"bn_proxy": Need("bn_proxy", when={"bn": ("proxy",)})}
    # Its L2 distance forms each stacked problem's trial gradient, yet stacking measured
    # faster than the loop on ResNet-18 too (benchmarks/stacked_attacks.py, 2 victims x 4
    # seeds: 1.27x with BN_exact, 1.20x without), so it stacks on every model.
    forms_gradients = False
    records_snapshots = False  # its seeds are one joint problem

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

    def stage(self, victims: Victims) -> Stage:
        _, height, width = victims.observations[0].input_shape
        return Stage("l2", self.lr, self.iterations, draw=image_start, prior=self._prior,
                     regularizers={"tv": self.tv, "l2": self.image_norm / (height * width)},
                     milestones=MILESTONES, boxed=True, stopper=self.stopper, joint=True)

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        """Each victim's seeds as one joint problem (loss trace summed over seeds); the seed
        whose gradient is closest in squared L2, without regularisers."""
        stage = self.stage(victims)
        solution = victims.solve(stage)
        images = solution.images().clamp(0, 1)  # (V, R, B, ...)
        scores = victims.distances(stage, images).cpu()
        labels = victims.labels(stage)
        out = []
        for v, reasons in enumerate(solution.stop_reasons):
            best, steps = int(scores[v].argmin()), int(solution.iterations[v].min())
            out.append(Reconstruction(
                images[v, best], labels[v], solution.loss_trace[:steps, v].sum(1).tolist(), steps,
                0.0, "diverged" if "diverged" in reasons else reasons[best], restart=best,
                extra={"bn": self.bn, "restart_scores": scores[v].tolist(),
                       "restart_images": images[v]}))
        return out

    def _prior(self, observations: list[Observation], restarts: int) -> Prior:
        """R_BN and the group term of victims x ``restarts`` stacked seeds (victim-major)."""
        bn_target = None if self.bn == "none" else stacked_statistics([checked(
            obs.bn_statistics if self.bn == "exact" else self.bn_proxy, obs.model,
            f"bn={self.bn!r}") for obs in observations], restarts)
        area = observations[0].input_shape[1] * observations[0].input_shape[2]
        grouped = restarts > 1 and self.group > 0
        group_mean: torch.Tensor | None = None
        step = 0

        def prior(images: torch.Tensor, moments) -> torch.Tensor:
            nonlocal step, group_mean
            step += 1
            loss = images.new_zeros(len(images))
            if bn_target is not None:
                loss = loss + self.bn_weight * bn_loss(moments(), bn_target, self.first_bn_weight)
            if grouped and step >= self.group_start and (
                    step - self.group_start) % self.group_every == 0:  # refresh the mean
                seeds = images.detach().unflatten(0, (-1, restarts))
                group_mean = seeds.mean(1, keepdim=True).expand_as(seeds).flatten(0, 1)
            if group_mean is not None:
                loss = loss + self.group * torch.linalg.vector_norm(
                    (images - group_mean).flatten(1), dim=1) / area
            return loss

        return prior
