"""Generative Gradient Leakage, GGA / GGL (Li et al., CVPR 2022), as in Refiner Ex. 3 and
CENSOR Eq. 6.

z* = argmin_z D(T(F(G(z))), g) + lambda * KL(z || N(0, I)),  x^ = G(z*)   (CENSOR Eq. 6)

G is a pretrained generator with output in [-1, 1] (mapped to the model's input by
``prior.to_model_input``; any kind of ``gan.kind``, through ``prior.GeneratorPrior``: z is
its latent, W+ for StyleGAN2 by default, and BigGAN is conditioned on the inferred
labels as in GGL), F the client's gradient of the cross-entropy with labels
inferred from the last layer (``label_inference.infer_labels``), and D GGL's distance:
per-tensor squared L2, summed and divided by the number of tensors. KL is GGL's
regulariser -0.5 * sum(1 + log(s^2 + 1e-10) - m^2 - s^2) with m, s the mean and
(biased) std of each image's latent entries, weight lambda = 0.1 (Refiner Ex. 3 uses
q = N(0, 1)). T is the adaptive gradient transformation (CENSOR §II-C): ``pruning``
applies the received gradient's zero mask to the trial gradient, ``clipping`` clips
each layer of the trial gradient at the bound estimated as the largest layer norm of
the received gradient (CENSOR Eq. 8), ``soteria`` keeps the columns of the final
Linear weight gradient that are non-zero in the received gradient.

Optimisers (GGL's official settings): ``cmaes`` (default), CMA-ES (``cma`` package)
with 50 samples per round, 500 rounds, z from zeros, step size 1 (the latent prior's
std); ``adam``, lr 0.1 with a 5% linear warm-up and a cosine decay over the last 25%,
500 iterations, z ~ N(0, I). Refiner Table 4 runs GGA with Adam, lr 0.01, 4,000
iterations: pass those to reproduce it. CMA-ES samples from a local numpy Generator
(cma's ``randn`` option) instead of cma's ``seed`` option, which reseeds numpy's
global RNG; its loss trace is the best loss found so far after each round.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from gradleak.attacks.base import Attack, register, stopper_from
from gradleak.attacks.prior import as_prior, frozen_copy, rendered
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stage import Stage, Transform
from gradleak.attacks.victims import Victims
from gradleak.needs import Need
from gradleak.types import Observation

TRANSFORMS = ("none", "pruning", "clipping", "soteria")
RAMPUP, RAMPDOWN = 0.05, 0.25


def ramped(iterations: int) -> Callable[[int], float]:
    """The lr factor of step t of ``iterations``: a linear warm-up over the first 5%, a
    cosine decay over the last 25% (the StyleGAN2 projector schedule of GGL and GIFD)."""
    def factor(step: int) -> float:
        t = step / iterations
        down = min(1.0, (1.0 - t) / RAMPDOWN)
        return (0.5 - 0.5 * math.cos(down * math.pi)) * min(1.0, t / RAMPUP)

    return factor


def adaptive_transform(name: str, obs: Observation) -> Transform:
    """The adaptive transformation T named ``name`` of one trial gradient, estimated from
    the received gradient."""
    received = obs.gradient
    if name == "none":
        return lambda trial, _: trial
    if name == "pruning":
        masks = {k: (g != 0).to(g.dtype) for k, g in received.items()}
        return lambda trial, _: {k: v * masks[k] for k, v in trial.items()}
    if name == "clipping":
        bound = max(float(g.norm()) for g in received.values())
        return lambda trial, _: {k: v * (bound / (v.norm() + 1e-12)).clamp(max=1.0)
                                 for k, v in trial.items()}
    if name == "soteria":
        key, weight_grad = obs.classifier_gradient()
        columns = (weight_grad != 0).any(dim=0).to(weight_grad.dtype)
        return lambda trial, _: {k: v * columns if k == key else v for k, v in trial.items()}
    raise ValueError(f"transform must be one of {TRANSFORMS}, got {name!r}")


@register("gga")
class GenerativeGradientLeakage(Attack):
    """GGL's latent search (CENSOR Eq. 6) with CMA-ES or Adam; see the module docstring."""

    needs = {"generator": Need("gan")}
    forms_gradients = True  # GGL's distance is L2: each stacked trial gradient is formed
    records_snapshots = False

    @classmethod
    def budget(cls, params: Mapping[str, Any]) -> int:
        """Gradient evaluations of one restart on one victim: Adam's iterations, or CMA-ES's
        rounds x its population (each candidate's gradient is matched against the upload)."""
        return params["iterations"] * (params["population"] if params["optimizer"] == "cmaes"
                                       else 1)

    def __init__(self, *, generator: nn.Module, optimizer: str, iterations: int, lr: float,
                 kl: float, population: int, sigma: float, transform: str, restarts: int,
                 stopper: dict | None, seed: int = 0) -> None:
        self.generator = frozen_copy(as_prior(generator))
        self.latent_dim = self.generator.latent_dim
        self.optimizer, self.iterations, self.lr, self.kl = optimizer, iterations, lr, kl
        self.population, self.sigma, self.transform = population, sigma, transform
        self.restarts, self.seed = restarts, seed
        self.stopper = stopper_from(stopper)

    @property
    def vectorisable(self) -> bool:
        """Adam stacks victims x restarts (CMA-ES stacks each round's population instead)."""
        return self.optimizer == "adam"

    def stage(self, victims: Victims) -> Stage:
        render = rendered(self.generator.to(victims.device), victims.observations[0].input_shape)
        return Stage("ggl", self.lr, self.iterations, regularizers={"kl": self.kl},
                     draw=self.generator.draw, render=render, fixed=self.generator.n_conditions,
                     lr_factor=ramped(self.iterations), stopper=self.stopper,
                     transform=None if self.transform == "none"
                     else partial(adaptive_transform, self.transform))

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        stage = self.stage(victims)
        if self.optimizer == "adam":
            out = victims.reconstructions(victims.solve(stage))
        else:
            out = [self._cmaes(victims, stage, v) for v in range(len(victims.observations))]
        for rec in out:
            rec.extra["optimizer"] = self.optimizer
        return out

    def _cmaes(self, victims: Victims, stage: Stage, victim: int) -> Reconstruction:
        """Victim ``victim``'s restarts of CMA-ES; the one of lowest final loss."""
        import cma

        obs = victims.observations[victim]
        shape = (obs.batch_size, *self.generator.latent_shape)
        constants = self.generator.conditions(obs)  # BigGAN's classes: the same for all
        best, index = None, 0
        for restart in range(self.restarts):
            score, stopper = victims.scorer(stage, victim, restart), copy.deepcopy(self.stopper)
            rng = np.random.default_rng(victims.seed + victim + restart)
            es = cma.CMAEvolutionStrategy(np.zeros(math.prod(shape)), self.sigma, {
                "popsize": self.population, "seed": np.nan, "verbose": -9, "verb_log": 0,
                "verb_disp": 0, "randn": lambda *size, rng=rng: rng.standard_normal(size)})
            best_z, best_loss, trace = torch.zeros(shape, device=obs.device), math.inf, []
            reason = "max_iterations"
            for _ in range(self.iterations):
                candidates = es.ask()
                z = torch.as_tensor(np.stack(candidates), dtype=torch.get_default_dtype())
                z = z.to(obs.device).view(len(candidates), *shape)
                losses = [v if math.isfinite(v) else math.inf for v in score(
                    [z, *(c.expand(len(z), *c.shape) for c in constants)]).tolist()]
                es.tell(candidates, losses)
                if min(losses) < best_loss:
                    best_loss, best_z = min(losses), z[int(np.argmin(losses))].clone()
                trace.append(best_loss)
                if stopper is not None and (why := stopper.update(best_loss)) is not None:
                    reason = why
                    break
            if best is None or best_loss < best[0]:
                best, index = (best_loss, best_z, trace, reason), restart
        _, best_z, trace, reason = best
        with torch.no_grad():
            images = stage.images([best_z.unsqueeze(0), *(c.unsqueeze(0) for c in constants)]
                                  )[0].clamp(0, 1)
        return Reconstruction(images, stage.labels(obs), trace, len(trace), 0.0, reason,
                              restart=index)
