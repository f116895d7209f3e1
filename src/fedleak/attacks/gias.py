"""GIAS: gradient inversion in alternative spaces (Jeon et al., NeurIPS 2021, §4.1, App. A Alg. 1).

The cost c (Eqs. 2-3, labels given) is the negative cosine between the trial
and the observed gradient over all layers (Inverting Gradients, Geiping et al.)
plus lambda_TV TV(x). "+BN" adds lambda_BN R_BN (§4, after Yin et al.): the l2
distances between the per-channel mean / variance of each BatchNorm layer's
input for the trial batch and the client's exact batch statistics
(``Observation.bn_statistics``, BN_exact), the first layer weighted x10 as in
the official code (:mod:`fedleak.attacks.bn_statistics`,
:func:`fedleak.attacks.gradinversion.bn_loss`). Variants (Table 1, §5.1):

- ``x``: GI-x, argmin_x c(x) from x ~ N(0, I) (Inverting Gradients: Adam on the
  sign of the gradient, box [0, 1]);
- ``z``: GI-z, the latent space search argmin_z c(G_w(z)) (Eq. 5);
- ``w``: GI-w, the parameter space search argmin_{w_1..w_B} c(G_w1(z_1), ...)
  (Eq. 7) from a fixed random z;
- ``z/w``: GI-z/w (GIAS, Alg. 1): Eq. 5, then Eq. 7 with the found z fixed and
  one copy of the generator per image.

Defaults (App. H): Adam with lr x0.1 at 3/8, 5/8 and 7/8 of each stage,
eta_z = 3e-2, eta_w = 1e-3, eta_x = 0.1 (Inverting Gradients), lambda_TV = 1e-4,
lambda_BN = 1e-4 (the official code's GradInversion weight), best of 4 restarts
by final loss; 1,500 latent iterations (§5.1), 5,000 parameter iterations (the
official script for 32x32 images) and 24,000 image iterations (Inverting
Gradients). The generator (a DCGAN in [-1, 1] with a ``latent_dim``) is mapped
to the model input by :func:`fedleak.attacks.prior.to_model_input`; labels come
from :func:`fedleak.attacks.label_inference.infer_labels`; z ~ N(0, I). An
early stopper applies to each stage.

``sparsity`` > 0 is the official "sim_cmpr" cost for sparsified (pruned)
updates: the non-zero entries among the top (1 - sparsity) of each observed
layer form a mask applied to the trial gradient before the cosine.

Departures: TV is the anisotropic mean |dx| + mean |dy| of the official code
(Eq. 4 writes squared differences); "+BN" is R_BN alone, without the group-lazy
regulariser of the paper's GradInversion baseline (App. H), which couples
restarts run in lockstep. As in the official code, the restarts of GI-z/w are
those of the latent search: the parameter search runs once, from the best latent
code (for a deterministic generator every restart of that stage is identical).
GI-w draws a new z per restart.

Engine: every variant but the sparsified cost stacks victims x restarts
(``reconstruct_many``); the parameter search holds the generator copies of all
problems' images as stacked weights rendered through ``torch.func``
(:func:`per_image_generators`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedleak.attacks.base import Reconstruction, register, stopper_from
from fedleak.attacks.bn_statistics import (
    BNRecorder,
    Statistics,
    batchnorm_layers,
    preserved_buffers,
)
from fedleak.attacks.early_stopping import Stopper, copies
from fedleak.attacks.gradinversion import bn_loss, stacked_statistics
from fedleak.attacks.label_inference import infer_labels
from fedleak.attacks.objectives import RESIDUAL_DISTANCES, Candidate, compose, penalty
from fedleak.attacks.optimization import Trajectory, best_of_restarts, clamp_unit, optimize
from fedleak.attacks.prior import frozen_copy, latent_dim, to_model_input
from fedleak.attacks.stacked_problems import (
    BatchedTrajectory,
    StackedAttack,
    StackedPrior,
    first_of,
    in_chunks,
    reconstruct_stacked,
    stacked_loss,
    victim_targets,
)
from fedleak.types import Need, Observation, Update

MILESTONES = (3 / 8, 5 / 8, 7 / 8)
SPACES = ("x", "z", "w", "z/w")
VARIANTS = SPACES + tuple(f"{s}+BN" for s in SPACES)
FIRST_BN_WEIGHT = 10.0

Cost = Callable[[torch.Tensor], torch.Tensor]


def sparsity_masks(target: Sequence[torch.Tensor], sparsity: float) -> list[torch.Tensor]:
    """Per layer, the non-zero entries among the top ``1 - sparsity`` of |observed gradient|."""
    masks = []
    for g in target:
        k = max(1, int(g.numel() * (1 - sparsity)))
        threshold = g.abs().flatten().topk(k).values.min()
        masks.append(((g.abs() >= threshold) & (g != 0)).to(g.dtype))
    return masks


def _bn_target(obs: Observation) -> Statistics:
    """The client's BN statistics (BN_exact), checked against the model's BatchNorm layers."""
    if obs.bn_statistics is None:
        raise ValueError("the +BN variants need Observation.bn_statistics (BN_exact), got None")
    layers = batchnorm_layers(obs.model)
    shapes = [(layer.num_features,) for layer in layers]
    if not layers or [(tuple(m.shape), tuple(v.shape)) for m, v in obs.bn_statistics] != [
            (shape, shape) for shape in shapes]:
        raise ValueError(f"bn_statistics must hold one (mean, var) pair per BatchNorm layer of "
                         f"the model, of shapes {shapes}; got {len(obs.bn_statistics)} pairs")
    return [(m.to(obs.device), v.to(obs.device)) for m, v in obs.bn_statistics]


def inversion_cost(obs: Observation, labels: torch.Tensor, *, distance: str = "cosine",
                   tv: float = 1e-4, bn: float = 0.0, sparsity: float = 0.0) -> Cost:
    """c(x) of Eq. 3 for model-input images x: gradient distance + tv TV(x) (+ bn R_BN)."""
    loss_of = compose(distance, {"tv": tv})
    if tv < 0 or bn < 0:
        raise ValueError(f"tv and bn must be >= 0, got tv={tv}, bn={bn}")
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    target = obs.target_gradient()
    masks = sparsity_masks(target, sparsity) if sparsity > 0 else None
    if masks is not None:
        target = [g * m for g, m in zip(target, masks)]
    bn_target = _bn_target(obs) if bn > 0 else None

    def trial_gradient(images: torch.Tensor) -> list[torch.Tensor]:
        trial = list(Update.of(obs.model, images, labels, create_graph=True).values())
        return trial if masks is None else [g * m for g, m in zip(trial, masks)]

    def cost(images: torch.Tensor) -> torch.Tensor:
        if bn_target is None:
            trial, penalty = trial_gradient(images), 0.0
        else:
            with BNRecorder(obs.model) as recorder:
                trial = trial_gradient(images)
            penalty = bn * bn_loss(recorder.statistics(), bn_target, FIRST_BN_WEIGHT)
        return loss_of(trial, target, Candidate(images)) + penalty

    return cost


def latent_search(generator: nn.Module, z: torch.Tensor, cost: Cost,
                  input_shape: tuple[int, int, int], *, lr: float, iterations: int,
                  z_norm: float = 0.0, stopper: Stopper | None = None) -> Trajectory:
    """Eq. 5 (and GIML's regularised Alg. 2 line 6): Adam on z, the generator fixed."""
    z = z.requires_grad_(True)
    latent_penalty = penalty({"latent_norm": z_norm} if z_norm > 0 else {})

    def objective() -> torch.Tensor:
        images = to_model_input(generator(z), input_shape)
        return cost(images) + latent_penalty(Candidate(images, z))

    return optimize([z], objective, optimizer="adam", lr=lr, iterations=iterations,
                    milestones=MILESTONES, stopper=stopper)


def generate(generators: Sequence[nn.Module], z: torch.Tensor,
             input_shape: tuple[int, int, int]) -> torch.Tensor:
    """Image k from generator k (one generator for all when a single one is given)."""
    if len(generators) == 1:
        return to_model_input(generators[0](z), input_shape)
    return to_model_input(torch.cat([g(z[k:k + 1]) for k, g in enumerate(generators)]),
                          input_shape)


def per_image_generators(generator: nn.Module, input_shape: tuple[int, int, int]
                         ) -> Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]:
    """:func:`generate` for P stacked problems: ``render(weights, z)`` maps each problem's
    B generator copies (``weights``: parameter name -> (P, B, *shape)) and codes z
    (P, B, latent) to images (P, B, ...), image k of a problem from its copy k."""
    def one(weights: dict[str, torch.Tensor], code: torch.Tensor) -> torch.Tensor:
        return functional_call(generator, weights, (code.unsqueeze(0),)).squeeze(0)

    each = vmap(one)

    def render(weights: dict[str, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
        images = each({n: w.flatten(0, 1) for n, w in weights.items()}, z.flatten(0, 1))
        return to_model_input(images, input_shape).unflatten(0, z.shape[:2])

    return render


def trainable_copies(generator: nn.Module, count: int) -> list[nn.Module]:
    """``count`` eval-mode copies of ``generator`` whose weights require gradients."""
    return [copy.deepcopy(generator).eval().requires_grad_(True) for _ in range(count)]


def parameter_search(generators: Sequence[nn.Module], objective: Callable[[], torch.Tensor], *,
                     lr: float, iterations: int, stopper: Stopper | None = None) -> Trajectory:
    """Eq. 7 (and GIML's Alg. 2 line 9): Adam on the weights of ``generators``, z fixed."""
    variables = [p for g in generators for p in g.parameters()]
    return optimize(variables, objective, optimizer="adam", lr=lr, iterations=iterations,
                    milestones=MILESTONES, stopper=stopper)


def stop_reason(search: Trajectory, problem: int) -> str:
    """Why stacked problem ``problem`` of ``search`` stopped."""
    if search.stop_reasons is not None:
        return search.stop_reasons[problem]
    return "diverged" if search.diverged[problem] else "max_iterations"


@register("gias")
class GIAS:
    """GI-x, GI-z, GI-w and GI-z/w (GIAS), each optionally "+BN" (Table 1).

    ``Reconstruction.extra`` holds the variant, the iterations per stage and, for
    the generator variants, the latent code z (the GI-z result is G(z)).
    """

    needs = {"generator": Need("gan", when={"variant": tuple(v for v in VARIANTS
                                                         if not v.startswith("x"))})}

    def __init__(self, *, variant: str, latent_iterations: int, parameter_iterations: int,
                 image_iterations: int, lr_z: float, lr_w: float, lr_x: float, tv: float,
                 bn: float, restarts: int, signed: bool, sparsity: float, distance: str,
                 stopper: dict | None, generator: nn.Module | None = None,
                 seed: int = 0) -> None:
        self.space, self.use_bn = variant.removesuffix("+BN"), variant.endswith("+BN")
        if self.space != "x":
            latent_dim(generator)
        self.generator, self.variant = generator, variant
        self.latent_iterations, self.parameter_iterations = latent_iterations, parameter_iterations
        self.image_iterations, self.restarts = image_iterations, restarts
        self.lr_z, self.lr_w, self.lr_x, self.tv, self.bn = lr_z, lr_w, lr_x, tv, bn
        self.signed, self.sparsity, self.distance, self.seed = signed, sparsity, distance, seed
        self.stopper = stopper_from(stopper)

    def __call__(self, obs: Observation, stopper: Stopper | None = None) -> Reconstruction:
        start = time.perf_counter()
        stopper = stopper or self.stopper
        labels = infer_labels(obs)
        cost = inversion_cost(obs, labels, distance=self.distance, tv=self.tv,
                              bn=self.bn if self.use_bn else 0.0, sparsity=self.sparsity)
        rng = torch.Generator().manual_seed(self.seed)
        with preserved_buffers(obs.model):  # train-mode BatchNorm would update running stats
            if self.space == "x":
                best, index, _ = best_of_restarts(
                    lambda _: self._image_search(obs, cost, rng, stopper), self.restarts)
                images, trace, stages = best.variables[0].detach(), best.loss_trace, {"x": best}
                extra = {}
            else:
                images, trace, stages, index, z = self._generator_search(obs, cost, rng, stopper)
                extra = {"latent": z.cpu()}
        best = stages[self.space[-1]]
        extra.update(variant=self.variant,
                     iterations={name: t.iterations for name, t in stages.items()})
        return Reconstruction(images.clamp(0, 1), labels, trace,
                              sum(t.iterations for t in stages.values()),
                              time.perf_counter() - start, best.stop_reason, restart=index,
                              extra=extra)

    @property
    def vectorisable(self) -> bool:
        """Every variant (+BN too) stacks victims x restarts; the sparsified cost loops."""
        return self.sparsity == 0

    @property
    def forms_gradients(self) -> bool:
        """An L2 distance forms each stacked problem's trial gradient."""
        return self.distance in RESIDUAL_DISTANCES

    def reconstruct_many(self, observations: list[Observation], progress: str | None = None
                         ) -> list[Reconstruction]:
        """One Reconstruction per observation, the searches of victims x restarts optimised
        together, victim v with seed ``self.seed + v`` as the per-victim attack: the image
        (GI-x) or latent (GI-z, GI-z/w) search through
        :func:`~fedleak.attacks.stacked_problems.reconstruct_stacked`, the parameter search
        (GI-w; GI-z/w from each victim's best latent code) through
        :meth:`_stacked_parameters`."""
        if not self.vectorisable:
            raise ValueError(f"reconstruct_many stacks GIAS without sparsity; got "
                             f"variant={self.variant!r}, sparsity={self.sparsity} (use "
                             "reconstruct_all to loop)")
        start, first = time.perf_counter(), first_of(observations)
        prior = None
        if self.use_bn:
            targets = {id(obs): _bn_target(obs) for obs in observations}  # checked up front

            def prior(chunk: list[Observation], restarts: int) -> StackedPrior:
                stats = stacked_statistics([targets[id(obs)] for obs in chunk], restarts)
                return lambda _, stacked: self.bn * bn_loss(stacked.batchnorm_statistics(),
                                                            stats, FIRST_BN_WEIGHT)
        frozen = None if self.space == "x" else frozen_copy(self.generator, first.device)
        if self.space == "w":
            out = in_chunks(observations, self.restarts, progress,
                            lambda part, begin: self._stacked_w(part, begin, frozen, prior))
        else:
            out = self._stacked_search(observations, frozen, prior, progress)
        if self.space == "z/w":  # the parameter search from each victim's best latent code
            latent_stage = out
            stage = progress and f"{progress} (parameter search)"
            out = in_chunks(observations, 1, stage, lambda part, begin: self._then_parameters(
                part, latent_stage[begin:begin + len(part)], frozen, prior))
        share = (time.perf_counter() - start) / len(observations)
        for rec in out:
            rec.wall_time = share
        return out

    def _stacked_search(self, observations: list[Observation], frozen: nn.Module | None,
                        prior, progress: str | None) -> list[Reconstruction]:
        """GI-x's image or GI-z(/w)'s latent search of victims x restarts, stacked."""
        first = observations[0]
        settings = {"distance": self.distance, "regularizers": {"tv": self.tv},
                    "milestones": MILESTONES}
        if frozen is None:
            settings.update(lr=self.lr_x, iterations=self.image_iterations, signed=self.signed)
            shape = first.input_shape
        else:
            shape = (frozen.latent_dim,)
            settings.update(lr=self.lr_z, iterations=self.latent_iterations, boxed=False,
                            render=lambda z: generate([frozen], z.flatten(0, 1),
                                                      first.input_shape).unflatten(0, z.shape[:2]))
        out = reconstruct_stacked(observations, StackedAttack(
            draw=lambda obs, rng: obs.randn((obs.batch_size, *shape), rng), labels=infer_labels,
            settings=settings, prior=prior, stopper=self.stopper), restarts=self.restarts,
            seed=self.seed, progress=progress)
        for rec in out:
            rec.extra.update(variant=self.variant, iterations={self.space[0]: rec.iterations})
        return out

    def _stacked_parameters(self, observations: list[Observation], z: torch.Tensor,
                            labels: torch.Tensor, frozen: nn.Module, prior
                            ) -> tuple[torch.Tensor, Trajectory]:
        """Eq. 7 for V victims x R restarts at once from their fixed latent codes z
        (V, R, B, latent), one generator copy per image (``torch.func`` over the stacked
        weights): the images (V, R, B, ...) and the stacked trajectory (P = V x R)."""
        victims, restarts, batch = z.shape[:3]
        model = observations[0].model
        loss_of = stacked_loss(model, labels.repeat_interleave(restarts, 0),
                               victim_targets(observations), distance=self.distance,
                               regularizers={"tv": self.tv},
                               prior=None if prior is None else prior(observations, restarts))
        weights = {n: p.detach().expand(victims * restarts, batch, *p.shape).clone()
                   .requires_grad_(True) for n, p in frozen.named_parameters()}
        render = per_image_generators(frozen, observations[0].input_shape)
        codes = z.flatten(0, 1)
        search = optimize(list(weights.values()), lambda: loss_of(render(weights, codes)),
                          optimizer="adam", lr=self.lr_w, iterations=self.parameter_iterations,
                          milestones=MILESTONES, stopper=copies(self.stopper, victims * restarts))
        with torch.no_grad():
            images = render(weights, codes).unflatten(0, (victims, restarts))
        return images, search

    def _stacked_w(self, observations: list[Observation], begin: int, frozen: nn.Module,
                   prior) -> list[Reconstruction]:
        """GI-w for a chunk of victims: a new z per restart (drawn as the loop draws it) and
        its parameter search, stacked; each victim keeps its restart of lowest final loss."""
        def codes(v: int, obs: Observation) -> torch.Tensor:
            rng = torch.Generator().manual_seed(self.seed + begin + v)
            return torch.stack([obs.randn((obs.batch_size, frozen.latent_dim), rng)
                                for _ in range(self.restarts)])

        z = torch.stack([codes(v, obs) for v, obs in enumerate(observations)]).to(
            observations[0].device)
        labels = torch.stack([infer_labels(obs) for obs in observations])
        images, search = self._stacked_parameters(observations, z, labels, frozen, prior)
        grid = (len(observations), self.restarts)
        run = BatchedTrajectory(images, search.loss_trace.unflatten(1, grid),
                                search.iterations.unflatten(0, grid),
                                search.diverged.unflatten(0, grid))
        best, trace = run.best_restart().cpu(), run.loss_trace.cpu()
        out = []
        for v in range(len(observations)):
            r = int(best[v])
            steps = int(run.iterations[v, r])
            out.append(Reconstruction(
                images[v, r].clamp(0, 1), labels[v], trace[:steps, v, r].tolist(), steps, 0.0,
                stop_reason(search, v * self.restarts + r), restart=r,
                extra={"latent": z[v, r].cpu(), "variant": self.variant,
                       "iterations": {"w": steps}, "vectorised_problems": run.diverged.numel()}))
        return out

    def _then_parameters(self, observations: list[Observation], recs: list[Reconstruction],
                         frozen: nn.Module, prior) -> list[Reconstruction]:
        """GI-z/w's parameter search (Eq. 7) for a chunk of victims from their stacked
        latent stage, stacked."""
        z = torch.stack([rec.extra["latent"] for rec in recs]).unsqueeze(1).to(
            observations[0].device)
        labels = torch.stack([rec.labels for rec in recs])
        images, search = self._stacked_parameters(observations, z, labels, frozen, prior)
        trace = search.loss_trace.cpu()
        out = []
        for v, rec in enumerate(recs):
            steps = int(search.iterations[v])
            rec.extra["iterations"]["w"] = steps
            out.append(replace(rec, images=images[v, 0].clamp(0, 1),
                               loss_trace=rec.loss_trace + trace[:steps, v].tolist(),
                               iterations=rec.iterations + steps,
                               stop_reason=stop_reason(search, v)))
        return out

    def _parameter_stage(self, obs: Observation, cost: Cost, frozen: nn.Module,
                         z: torch.Tensor, stopper: Stopper | None
                         ) -> tuple[torch.Tensor, Trajectory]:
        """Eq. 7 from the fixed latent code z, one generator copy per image: the images
        and the trajectory."""
        copies = trainable_copies(frozen, obs.batch_size)
        search = parameter_search(copies, lambda: cost(generate(copies, z, obs.input_shape)),
                                  lr=self.lr_w, iterations=self.parameter_iterations,
                                  stopper=stopper)
        with torch.no_grad():
            return generate(copies, z, obs.input_shape), search

    def _image_search(self, obs: Observation, cost: Cost, rng: torch.Generator,
                      stopper: Stopper | None) -> Trajectory:
        x = obs.randn((obs.batch_size, *obs.input_shape), rng).requires_grad_(True)
        return optimize([x], lambda: cost(x), optimizer="adam", lr=self.lr_x,
                        iterations=self.image_iterations, signed=self.signed,
                        milestones=MILESTONES, project=clamp_unit, stopper=stopper)

    def _generator_search(self, obs: Observation, cost: Cost, rng: torch.Generator,
                          stopper: Stopper | None):
        """GI-z, GI-w or GI-z/w: images, loss trace, stage trajectories, restart, latent code."""
        frozen = frozen_copy(self.generator, obs.device)
        latent_shape = (obs.batch_size, frozen.latent_dim)
        stages: dict[str, Trajectory] = {}
        if self.space == "w":  # every restart: a new random z and its own parameter search
            runs: list[tuple[torch.Tensor, list[nn.Module]]] = []

            def run_once(_: int) -> Trajectory:
                z = obs.randn(latent_shape, rng)
                copies = trainable_copies(frozen, obs.batch_size)
                runs.append((z, copies))
                return parameter_search(copies, lambda: cost(generate(copies, z, obs.input_shape)),
                                        lr=self.lr_w, iterations=self.parameter_iterations,
                                        stopper=stopper)

            stages["w"], index, _ = best_of_restarts(run_once, self.restarts)
            z, copies = runs[index]
        else:
            stages["z"], index, _ = best_of_restarts(
                lambda _: latent_search(frozen, obs.randn(latent_shape, rng), cost,
                                        obs.input_shape, lr=self.lr_z,
                                        iterations=self.latent_iterations, stopper=stopper),
                self.restarts)
            z, copies = stages["z"].variables[0].detach(), [frozen]
        if self.space == "z/w":
            images, stages["w"] = self._parameter_stage(obs, cost, frozen, z, stopper)
        else:
            with torch.no_grad():
                images = generate(copies, z, obs.input_shape)
        trace = [loss for t in stages.values() for loss in t.loss_trace]
        return images, trace, stages, index, z
