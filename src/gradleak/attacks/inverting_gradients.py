"""Inverting Gradients (Geiping et al., NeurIPS 2020, §4, Eq. 4).

argmin_x 1 - <g(x), g> / (||g(x)|| ||g||) + lambda_TV TV(x) over the box [0, 1],
with the cosine taken over all layers at once. Adam (lr 0.1) on the sign of the
gradient, lr x 0.1 at 3/8, 5/8 and 7/8 of 24,000 iterations, x from N(0, 1),
lambda_TV = 1e-4, best of ``restarts`` by final loss; ``distance: layer_cosine`` matches
each layer's cosine instead (their mean), the objective an adaptive attacker applies
through per-layer clipping, here on any upload (decision 0107). Labels: the observed ones
when the attacker knows them, else inferred from the last layer (iDLG for one image).
On a sequence of uploads of one client's images (``gradient_sequence``, GIAS App. D,
Fig. A3) the cost is summed over the uploads, each on its images.
"""

from __future__ import annotations

from gradleak.attacks.base import Attack, register, stopper_from
from gradleak.attacks.objectives import FORMED_DISTANCES, RESIDUAL_DISTANCES
from gradleak.attacks.stage import Stage, image_start
from gradleak.attacks.victims import Victims

MILESTONES = (3 / 8, 5 / 8, 7 / 8)


@register("inverting_gradients")
class InvertingGradients(Attack):
    sequences = True  # its cost is its stage's alone: summed over a sequence's uploads

    def __init__(self, *, iterations: int, lr: float, tv: float, restarts: int, signed: bool,
                 boxed: bool, distance: str, stopper: dict | None, seed: int = 0) -> None:
        self.iterations, self.lr, self.tv, self.restarts = iterations, lr, tv, restarts
        self.signed, self.boxed, self.distance, self.seed = signed, boxed, distance, seed
        self.stopper = stopper_from(stopper)

    @property
    def forms_gradients(self) -> bool:
        """An L2 or per-layer distance forms each stacked trial gradient (cosine needs only
        products)."""
        return self.distance in RESIDUAL_DISTANCES or self.distance in FORMED_DISTANCES

    def stage(self, victims: Victims) -> Stage:
        return Stage(self.distance, self.lr, self.iterations, draw=image_start,
                     regularizers={"tv": self.tv}, signed=self.signed, milestones=MILESTONES,
                     boxed=self.boxed, stopper=self.stopper)
