"""Fan, Wang, Chen and Zhou, "Boosting Gradient Leakage Attacks: Data Reconstruction in
Realistic FL Settings" (USENIX Security 2025), the attack they name FedLeak, registered
here as ``fan2025`` so that it is not taken for this package. Read from the authors'
artifact (Zenodo 10.5281/zenodo.15532455, ``attack.py`` and ``generator.py``), whose
demo's defaults are these; the paper's text beyond its abstract was not read
(docs/fan2025.md).

- **Partial gradient matching** (``distance: partial``, ``objectives.partial_matching``):
  per parameter tensor, only the half of the entries where the trial gradient is largest
  is matched, by mean |M g - M g'| minus the cosine of M g and M g', summed over the
  tensors; plus 1e-5 x TV.
- **Gradient regularisation** (``lookahead`` alpha = 0.3): every iteration steps on
  (1 - alpha) s0 + alpha s1, s0 the sign of the loss's gradient and s1 its sign one step
  ahead (``optimization.optimize``). Zhao et al.'s finite-difference form of a penalty on
  the gradient's norm (ICML 2022), which this is said to be, takes s1 uphill; the
  artifact takes it where its own (downhill) step went, to first order the opposite
  sign of the penalty's term: ``probe: descent`` (the artifact's) or ``ascent`` (the
  penalty's), m94.
- **The images** are an untrained generator's output (``models.dip.DeepImagePrior``,
  ``channels`` 256, codes of 128 drawn N(0, I) once per restart and fixed), whose weights
  are what is optimised: AdamW at lr 1e-2 on the signs, cosine annealing to 0 over
  ``iterations`` 10,000 (T_max = iterations + 1, as the artifact's 10,001), one restart,
  the result median-filtered 5 x 5 (reflected edges).

Options for readings that may differ from the paper's: ``distance: partial_received``
masks by the received gradient instead; ``lookahead: 0`` steps plainly; ``probe:
ascent`` regularises as Zhao et al.'s penalty does; ``space:
pixels`` optimises the images themselves (from N(0, 1), clamped to [0, 1]) instead of
the generator; ``median_filter: 1`` keeps the output as it is. Labels are the observed
ones when the attacker knows them (the artifact's), else inferred from the last layer.
On a FedAvg upload the trial unrolls the client's local steps like the other
gradient-matching attacks (``attacks.unrolled``); adaptively, ``eot`` wraps it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from scipy.ndimage import median_filter
from torch.func import functional_call, vmap

from gradleak.attacks.base import Attack, register, stopper_from
from gradleak.attacks.objectives import FORMED_DISTANCES, RESIDUAL_DISTANCES
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stage import Stage, Variables, image_start
from gradleak.attacks.victims import Victims
from gradleak.models.dip import DeepImagePrior
from gradleak.types import Observation

SPACES = ("generator", "pixels")


def annealed(iterations: int) -> Callable[[int], float]:
    """The lr factor of step t: the artifact's CosineAnnealingLR(T_max = iterations + 1)."""
    return lambda step: 0.5 * (1 + math.cos(math.pi * step / (iterations + 1)))


def median_filtered(images: torch.Tensor, size: int) -> torch.Tensor:
    """Each image's channels (B, C, H, W) median-filtered size x size, edges reflected as
    the artifact's ``MedianPool2d`` pads them (scipy's ``mirror``)."""
    out = median_filter(images.cpu().numpy(), size=(1, 1, size, size), mode="mirror")
    return torch.from_numpy(np.ascontiguousarray(out)).to(images)


@register("fan2025")
class Fan2025(Attack):
    def __init__(self, *, iterations: int, lr: float, tv: float, lookahead: float,
                 probe: str, distance: str, space: str, channels: int, code_dim: int,
                 median_filter: int, restarts: int, stopper: dict | None, seed: int = 0) -> None:
        if space not in SPACES:
            raise ValueError(f"space must be one of {SPACES}, got {space!r}")
        self.iterations, self.lr, self.tv, self.lookahead = iterations, lr, tv, lookahead
        self.probe = probe
        self.distance, self.space = distance, space
        self.channels, self.code_dim = channels, code_dim
        self.median_filter, self.restarts, self.seed = median_filter, restarts, seed
        self.stopper = stopper_from(stopper)
        self.optimizer = "adamw"

    @property
    def forms_gradients(self) -> bool:
        """Partial matching (and an L2 distance) forms each stacked trial gradient."""
        return self.distance in FORMED_DISTANCES or self.distance in RESIDUAL_DISTANCES

    def stage(self, victims: Victims) -> Stage:
        settings = {"regularizers": {"tv": self.tv}, "signed": True, "optimizer": "adamw",
                    "lookahead": self.lookahead, "probe": self.probe,
                    "lr_factor": annealed(self.iterations), "stopper": self.stopper}
        if self.space == "pixels":
            return Stage(self.distance, self.lr, self.iterations, draw=image_start,
                         boxed=True, **settings)
        shape = victims.observations[0].input_shape
        generator = DeepImagePrior(shape, self.channels, self.code_dim).to(victims.device)
        names = [name for name, _ in generator.named_parameters()]

        def draw(obs: Observation, rng: torch.Generator) -> Variables:
            seed = int(torch.randint(2**62, (), generator=rng))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                fresh = DeepImagePrior(shape, self.channels, self.code_dim)
            codes = torch.randn((obs.batch_size, self.code_dim), generator=rng)
            return [p.detach().to(obs.device) for p in fresh.parameters()] + [codes.to(obs.device)]

        def one(weights: dict[str, torch.Tensor], codes: torch.Tensor) -> torch.Tensor:
            return functional_call(generator, weights, (codes,))

        each = vmap(one)

        def render(variables: Variables) -> torch.Tensor:
            return each(dict(zip(names, variables[:-1])), variables[-1])

        return Stage(self.distance, self.lr, self.iterations, draw=draw, render=render,
                     fixed=1, **settings)

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        """The engine's reconstructions, median-filtered (``median_filter`` > 1)."""
        out = super().reconstruct(victims)
        if self.median_filter > 1:
            for rec in out:
                rec.images = median_filtered(rec.images, self.median_filter)
        return out
