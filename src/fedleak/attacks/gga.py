"""Generative Gradient Leakage, GGA / GGL (Li et al., CVPR 2022), as in Refiner Ex. 3 and
CENSOR Eq. 6.

z* = argmin_z D(T(F(G(z))), g) + lambda * KL(z || N(0, I)),  x^ = G(z*)   (CENSOR Eq. 6)

G is a pretrained generator with output in [-1, 1] (mapped to the model's input by
``prior.to_model_input``), F the client's gradient of the cross-entropy with labels
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

Engine: each CMA-ES round scores its population as one batch stacked through the model
(``stacked_gradients.StackedModel.gradients``, the candidates' trial gradients formed, then
T); Adam stacks victims x restarts (``reconstruct_many``). Both loop instead on models where
forming stacked gradients does not pay (``stacked_gradients.forming_pays``: above 2M
parameters, e.g. ResNet-18, measured).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import vmap

from fedleak.attacks.base import Reconstruction, register, stopper_from
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.label_inference import infer_labels
from fedleak.attacks.objectives import (
    STACKED_DISTANCES,
    Candidate,
    GradientProducts,
    compose,
    penalty,
)
from fedleak.attacks.optimization import Trajectory, best_of_restarts, optimize
from fedleak.attacks.prior import frozen_copy, latent_dim, to_model_input
from fedleak.attacks.stacked_gradients import StackedModel, forming_pays, unsupported
from fedleak.attacks.stacked_problems import (
    RestartTransforms,
    StackedAttack,
    Transform,
    first_of,
    per_problem,
    reconstruct_stacked,
)
from fedleak.types import Need, Observation, Update

TRANSFORMS = ("none", "pruning", "clipping", "soteria")
RAMPUP, RAMPDOWN = 0.05, 0.25


def ramp(t: float) -> float:
    """lr factor at progress t in [0, 1]: linear warm-up over the first 5%, cosine decay over
    the last 25% (the StyleGAN2 projector schedule used by GGL and GIFD)."""
    down = min(1.0, (1.0 - t) / RAMPDOWN)
    return (0.5 - 0.5 * math.cos(down * math.pi)) * min(1.0, t / RAMPUP)


def ramped(iterations: int) -> Callable[[int], float]:
    """The lr factor of step t of ``iterations``: :func:`ramp` (for ``optimize``'s
    ``lr_factor``)."""
    return lambda step: ramp(step / iterations)


def adaptive_transform(name: str, obs: Observation) -> Transform:
    """The adaptive transformation T named ``name``, estimated from the received gradient;
    it transforms one trial gradient or several stacked on leading dimensions."""
    received = obs.gradient
    if name == "none":
        return lambda trial, _: trial
    if name == "pruning":
        masks = {k: (g != 0).to(g.dtype) for k, g in received.items()}
        return lambda trial, _: {k: v * masks[k] for k, v in trial.items()}
    if name == "clipping":
        bound = max(float(g.norm()) for g in received.values())

        def clip(trial: Update, _: torch.Tensor) -> Update:
            out = {}
            for k, v in trial.items():
                dims = received[k].ndim  # the norm of each problem's layer
                norm = v.flatten(v.ndim - dims).norm(dim=-1)
                out[k] = v * (bound / (norm + 1e-12)).clamp(max=1.0).view(*norm.shape,
                                                                          *(1,) * dims)
            return out

        return clip
    if name == "soteria":
        key, weight_grad = obs.classifier_gradient()
        columns = (weight_grad != 0).any(dim=0).to(weight_grad.dtype)
        return lambda trial, _: {k: v * columns if k == key else v for k, v in trial.items()}
    raise ValueError(f"transform must be one of {TRANSFORMS}, got {name!r}")


@register("gga")
class GenerativeGradientLeakage:
    """GGL's latent search (CENSOR Eq. 6) with CMA-ES or Adam; see the module docstring."""

    needs = {"generator": Need("gan")}
    forms_gradients = True  # GGL's distance is L2: each stacked trial gradient is formed

    def __init__(self, *, generator: nn.Module, optimizer: str, iterations: int, lr: float,
                 kl: float, population: int, sigma: float, transform: str, restarts: int,
                 stopper: dict | None, seed: int = 0) -> None:
        self.generator = frozen_copy(generator)
        self.latent_dim = latent_dim(self.generator)
        self.optimizer, self.iterations, self.lr, self.kl = optimizer, iterations, lr, kl
        self.population, self.sigma, self.transform = population, sigma, transform
        self.restarts, self.seed = restarts, seed
        self.stopper = stopper_from(stopper)

    def _images(self, z: torch.Tensor, obs: Observation) -> torch.Tensor:
        return to_model_input(self.generator(z), obs.input_shape)

    @property
    def vectorisable(self) -> bool:
        """Adam stacks victims x restarts (CMA-ES stacks each round's population instead)."""
        return self.optimizer == "adam"

    def reconstruct_many(self, observations: list[Observation], progress: str | None = None,
                         trial_transforms: Sequence[RestartTransforms] | None = None
                         ) -> list[Reconstruction]:
        """One Reconstruction per observation, the latent searches of victims x restarts
        optimised together (:func:`~fedleak.attacks.stacked_problems.reconstruct_stacked`);
        victim v uses seed ``self.seed + v``, as the per-victim attack built with it, and
        ``trial_transforms[v]`` (EOT) in place of the adaptive T when given."""
        if not self.vectorisable:
            raise ValueError(f"reconstruct_many stacks Adam; got optimizer={self.optimizer!r} "
                             "(use reconstruct_all to loop)")
        first = first_of(observations)
        self.generator.to(first.device)

        def render(z: torch.Tensor) -> torch.Tensor:
            return self._images(z.flatten(0, 1), first).unflatten(0, z.shape[:2])

        settings = {"distance": "ggl", "regularizers": {"kl": self.kl}, "render": render,
                    "lr": self.lr, "iterations": self.iterations,
                    "lr_factor": ramped(self.iterations), "boxed": False}
        return reconstruct_stacked(observations, StackedAttack(
            draw=lambda obs, rng: obs.randn((obs.batch_size, self.latent_dim), rng),
            labels=infer_labels, settings=settings, extra={"optimizer": "adam"},
            stopper=self.stopper,
            transform=None if self.transform == "none"
            else lambda obs: adaptive_transform(self.transform, obs)),
            restarts=self.restarts, seed=self.seed, progress=progress,
            trial_transforms=trial_transforms)

    def __call__(self, obs: Observation, stopper: Stopper | None = None,
                 trial_transform: RestartTransforms | None = None) -> Reconstruction:
        """Reconstruct ``obs``; ``trial_transform(restart)`` (EOT) replaces the adaptive T."""
        labels = infer_labels(obs)
        target = obs.target_gradient()
        names = [n for n, _ in obs.model.named_parameters()]
        adaptive = adaptive_transform(self.transform, obs)
        self.generator.to(obs.device)
        stopper = stopper or self.stopper

        objective = compose("ggl", {"kl": self.kl})

        def transform_of(restart: int) -> Transform:
            return adaptive if trial_transform is None else trial_transform(restart)

        def loss_of(z: torch.Tensor, transform: Transform) -> torch.Tensor:
            images = self._images(z, obs)
            trial = transform(Update.of(obs.model, images, labels, create_graph=True), images)
            return objective([trial[n] for n in names], target, Candidate(images, z))

        shape = (obs.batch_size, self.latent_dim)
        if self.optimizer == "adam":
            rng = torch.Generator().manual_seed(self.seed)

            def run_once(index: int) -> Trajectory:
                z = obs.randn(shape, rng).requires_grad_(True)
                transform = transform_of(index)
                return optimize([z], lambda: loss_of(z, transform),
                                optimizer="adam", lr=self.lr, iterations=self.iterations,
                                lr_factor=ramped(self.iterations), stopper=stopper)
        else:
            def run_once(index: int) -> Trajectory:
                score = self._population_score(obs, labels, transform_of(index),
                                               trial_transform is None)
                return self._cmaes(obs, shape, score, self.seed + index, stopper)

        best, index, seconds = best_of_restarts(run_once, self.restarts)
        with torch.no_grad():
            images = self._images(best.variables[0].detach(), obs).clamp(0, 1)
        return Reconstruction(images, labels, best.loss_trace, best.iterations, seconds,
                              best.stop_reason, restart=index,
                              extra={"optimizer": self.optimizer})

    def _population_score(self, obs: Observation, labels: torch.Tensor, transform: Transform,
                          stackable: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        """The losses (N,) of N latent candidates (N, B, latent), without gradients: the
        candidates run through the model as one batch (``StackedModel``, in chunks of
        ``problems_per_step``), or one by one for a model it cannot stack. ``stackable``:
        ``transform`` takes trial gradients stacked on a leading dimension (the adaptive T
        does; EOT's defense samples are applied per candidate). One by one also where
        stacking does not pay (``stacked_gradients.forming_pays``: large models)."""
        names = [n for n, _ in obs.model.named_parameters()]
        target = obs.target_gradient()

        def images_of(z: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return self._images(z.flatten(0, 1), obs).unflatten(0, z.shape[:2])

        if unsupported(obs.model) or not forming_pays(obs.model):
            objective = compose("ggl", {"kl": self.kl})

            def one_by_one(z: torch.Tensor) -> torch.Tensor:
                losses = []
                for x, latent in zip(images_of(z), z):
                    trial = transform(Update.of(obs.model, x, labels), x)
                    losses.append(objective([trial[n] for n in names], target,
                                            Candidate(x, latent)).detach())
                return torch.stack(losses)

            return one_by_one
        stacked = StackedModel(obs.model)
        targets = {n: g.detach().unsqueeze(0) for n, g in zip(names, target)}
        probe = torch.zeros(obs.batch_size, *obs.input_shape, device=obs.device)
        per_step = stacked.problems_per_step(probe)
        kl = penalty({"kl": self.kl})
        regularization = vmap(lambda x, z: kl(Candidate(x, z)))

        def apply(trial: dict[str, torch.Tensor], images: torch.Tensor) -> dict[str, torch.Tensor]:
            if stackable:
                return transform(trial, images)
            return per_problem([transform] * len(images))(trial, images)

        def score(z: torch.Tensor) -> torch.Tensor:
            losses = []
            for part in z.split(per_step):
                images = images_of(part)
                trial = stacked.gradients(images, labels.expand(len(part), -1))
                products = GradientProducts.formed(apply(trial, images), targets)
                losses.append(STACKED_DISTANCES["ggl"](products) + regularization(images, part))
            return torch.cat(losses)

        return score

    def _cmaes(self, obs: Observation, shape: tuple[int, int],
               score: Callable[[torch.Tensor], torch.Tensor], seed: int,
               stopper: Stopper | None) -> Trajectory:
        import cma

        rng = np.random.default_rng(seed)
        es = cma.CMAEvolutionStrategy(np.zeros(math.prod(shape)), self.sigma, {
            "popsize": self.population, "randn": lambda *size: rng.standard_normal(size),
            "seed": np.nan, "verbose": -9, "verb_log": 0, "verb_disp": 0,
        })
        if stopper is not None:
            stopper.reset()
        best_z, best_loss = torch.zeros(shape, device=obs.device), math.inf
        trace: list[float] = []
        reason = "max_iterations"
        for _ in range(self.iterations):
            candidates = es.ask()
            z = torch.as_tensor(np.stack(candidates), dtype=torch.get_default_dtype())
            z = z.to(obs.device).view(len(candidates), *shape)
            losses = score(z).tolist()
            finite = [v if math.isfinite(v) else math.inf for v in losses]
            es.tell(candidates, finite)
            round_best = int(np.argmin(finite))
            if finite[round_best] < best_loss:
                best_loss, best_z = finite[round_best], z[round_best].clone()
            trace.append(best_loss)
            if stopper is not None and (why := stopper.update(best_loss)) is not None:
                reason = why
                break
        return Trajectory([best_z], trace, len(trace), reason)
