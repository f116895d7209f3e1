"""Gradient Inversion over Feature Domains, GIFD (Fang et al., ICCV 2023), as described in
CENSOR §II-B and §V-A (5).

Stage 0 searches the latent z of a pretrained generator G = B_K o ... o B_1; stage k >= 1
then optimises the intermediate feature f_k = B_k(f_{k-1}*) (the input of block k + 1)
through the remaining blocks, with the change of f_k from its stage start projected after
every step onto an l1 ball (per image; Duchi et al., ICML 2008) whose radius grows with
depth. Every stage minimises

    1 - cos(T(F(x)), g) + 1e-4 TV(x) + 1e-6 ||x||_2

(cosine over all layers, Inverting Gradients' Eq. 4; T as in ``gga``) with Adam, lr 0.1,
a 5% linear warm-up and a cosine decay over the last 25% of each stage. The output is the
stage image with the lowest gradient loss over all stages and restarts (the official
``choose_optimal`` returns the last restart's image, a bug not reproduced here).

Defaults follow the official BigGAN configuration: 1000 iterations per stage, 4 restarts,
z ~ N(0, I), the radius of feature stage k growing as r_1 + (k - 1) dr with dr = r_1 / 4
(2000, 2500, ... there). The blocks are the ConvTranspose2d blocks of ``generator.net``,
applied to z viewed as (B, latent, 1, 1) (``fedleak.models.dcgan.Generator``: the latent
and 3 feature stages). Absolute radii depend on the generator's feature sizes and scale,
so here a radius is a fraction of the l1 norm of the image's feature at the stage start:
0.1, 0.125, 0.15 by default (on digits with DP noise, larger radii let the later stages
fit the noise and lower PSNR). The official latent stage also renormalises z after each
step (its ``SphericalOptimizer``); that is not done here.

Engine: each stage of all victims x restarts runs as one stacked problem
(``reconstruct_many``, the l1 projections per image); with an adaptive T each problem's
trial gradient is formed, which stacks only on models where that pays
(``stacked_gradients.forming_pays``), as does EOT's sampled T (drawn per problem).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from fedleak.attacks.base import Reconstruction, register, stopper_from
from fedleak.attacks.early_stopping import Stopper, copies
from fedleak.attacks.gga import adaptive_transform, ramped
from fedleak.attacks.label_inference import infer_labels
from fedleak.attacks.objectives import (
    STACKED_DISTANCES,
    Candidate,
    GradientProducts,
    compose,
    cosine_distance,
)
from fedleak.attacks.optimization import Trajectory, optimize
from fedleak.attacks.prior import frozen_copy, latent_dim, to_model_input
from fedleak.attacks.stacked_gradients import StackedModel
from fedleak.attacks.stacked_problems import (
    BatchedTrajectory,
    RestartTransforms,
    Transform,
    check_one_each,
    first_of,
    in_chunks,
    optimize_vectorised,
    per_victim,
    restart_transforms,
    victim_targets,
)
from fedleak.types import Need, Observation, Update


def project_l1_ball(v: torch.Tensor, radius: float | torch.Tensor) -> torch.Tensor:
    """Euclidean projection of each row ``v[i]`` onto the l1 ball of ``radius`` (a number or
    one radius per row), by the sort-based algorithm of Duchi et al. (ICML 2008)."""
    flat = v.flatten(1)
    radius = torch.as_tensor(radius, dtype=v.dtype, device=v.device).reshape(-1, 1)
    magnitude = flat.abs()
    inside = magnitude.sum(dim=1, keepdim=True) <= radius
    sorted_mag = magnitude.sort(dim=1, descending=True).values
    cumulative = sorted_mag.cumsum(dim=1)
    ranks = torch.arange(1, flat.shape[1] + 1, device=v.device, dtype=v.dtype)
    support = (sorted_mag - (cumulative - radius) / ranks > 0).sum(dim=1, keepdim=True)
    theta = (cumulative.gather(1, (support - 1).clamp(min=0)) - radius) / support.clamp(min=1)
    projected = flat.sign() * (magnitude - theta).clamp(min=0)
    return torch.where(inside, flat, projected).view_as(v)


def conv_blocks(generator: nn.Module) -> list[nn.Sequential]:
    """``generator.net`` split before each ConvTranspose2d: the blocks B_1, ..., B_K."""
    net = getattr(generator, "net", None)
    if not isinstance(net, nn.Sequential):
        raise ValueError(f"GIFD needs generator.net, an nn.Sequential of ConvTranspose2d blocks; "
                         f"{type(generator).__name__} has none")
    starts = [i for i, m in enumerate(net) if isinstance(m, nn.ConvTranspose2d)]
    if not starts or starts[0] != 0:
        raise ValueError("generator.net must start with a ConvTranspose2d layer")
    ends = starts[1:] + [len(net)]
    return [net[a:b] for a, b in zip(starts, ends)]


@register("gifd")
class GIFD:
    """Latent, then intermediate-feature search of a generator; see the module docstring."""

    needs = {"generator": Need("gan")}

    @property
    def forms_gradients(self) -> bool:
        """An adaptive transformation forms each stacked problem's trial gradient."""
        return self.transform != "none"

    def __init__(self, *, generator: nn.Module, steps: Sequence[int], lr: float,
                 radii: Sequence[float], tv: float, image_norm: float, transform: str,
                 restarts: int, stopper: dict | None, seed: int = 0) -> None:
        self.generator = frozen_copy(generator)
        self.latent_dim = latent_dim(self.generator)
        self.blocks = conv_blocks(self.generator)
        steps = [int(s) for s in steps]
        if not 1 <= len(steps) <= len(self.blocks) or min(steps) < 1:
            raise ValueError(f"steps must list 1 to {len(self.blocks)} positive iteration counts "
                             f"(latent, then one per feature stage), got {list(steps)}")
        if len(radii) < len(steps) - 1 or any(r <= 0 for r in radii):
            raise ValueError(f"radii must give a positive radius for each of the "
                             f"{len(steps) - 1} feature stages, got {list(radii)}")
        self.steps, self.lr, self.radii = steps, lr, [float(r) for r in radii]
        self.tv, self.image_norm, self.transform = tv, image_norm, transform
        self.restarts, self.seed = restarts, seed
        self.stopper = stopper_from(stopper)

    def __call__(self, obs: Observation, stopper: Stopper | None = None,
                 trial_transform: RestartTransforms | None = None) -> Reconstruction:
        """Reconstruct ``obs``; ``trial_transform(restart)`` (EOT) replaces the adaptive T."""
        start = time.perf_counter()
        labels = infer_labels(obs)
        target = obs.target_gradient()
        names = [n for n, _ in obs.model.named_parameters()]
        adaptive = adaptive_transform(self.transform, obs)
        self.generator.to(obs.device)
        stopper = stopper or self.stopper
        rng = torch.Generator().manual_seed(self.seed)

        loss_of = compose("cosine", {"tv": self.tv, "l2": self.image_norm})

        def stage(variable: torch.Tensor, decode, iterations: int, ratio: float | None,
                  transform: Transform):
            def trial_gradient(images: torch.Tensor, create_graph: bool = True
                               ) -> list[torch.Tensor]:
                trial = transform(Update.of(obs.model, images, labels,
                                            create_graph=create_graph), images)
                return [trial[n] for n in names]

            origin = variable.detach().clone()
            # l1 radius of each image's change: ``ratio`` times its stage-start feature's l1 norm
            radius = None if ratio is None else ratio * origin.flatten(1).abs().sum(1, keepdim=True)

            def objective() -> torch.Tensor:
                images = to_model_input(decode(variable), obs.input_shape)
                return loss_of(trial_gradient(images), target, Candidate(images))

            def project(variables: list[torch.Tensor]) -> None:
                variables[0].copy_(origin + project_l1_ball(variables[0] - origin, radius))

            run = optimize([variable], objective, optimizer="adam", lr=self.lr,
                           iterations=iterations, lr_factor=ramped(iterations),
                           project=None if ratio is None else project, stopper=stopper)
            with torch.no_grad():
                images = to_model_input(decode(variable), obs.input_shape)
            distance = cosine_distance(trial_gradient(images, False), target)
            return run, float(distance.detach()), images.clamp(0, 1)

        best = None
        for restart in range(self.restarts):
            transform = adaptive if trial_transform is None else trial_transform(restart)
            z = obs.randn((obs.batch_size, self.latent_dim), rng).requires_grad_(True)
            runs = [stage(z, self.generator, self.steps[0], None, transform)]
            feature = self.blocks[0](z.detach().view(-1, self.latent_dim, 1, 1))
            for k, iterations in enumerate(self.steps[1:], start=1):
                variable = feature.detach().clone().requires_grad_(True)
                tail = nn.Sequential(*self.blocks[k:])
                runs.append(stage(variable, tail, iterations, self.radii[k - 1], transform))
                feature = self.blocks[k](variable.detach())
            losses = [score for _, score, _ in runs]
            index = min(range(len(runs)), key=losses.__getitem__)
            if best is None or losses[index] < best[0]:
                best = (losses[index], index, restart, runs)
        _, index, restart, runs = best
        trajectories: list[Trajectory] = [run for run, _, _ in runs]
        trace = [v for run in trajectories for v in run.loss_trace]
        return Reconstruction(runs[index][2], labels, trace, len(trace),
                              time.perf_counter() - start, trajectories[-1].stop_reason,
                              restart=restart,
                              extra={"stage": index, "stage_losses": [s for _, s, _ in runs]})

    def reconstruct_many(self, observations: list[Observation], progress: str | None = None,
                         trial_transforms: Sequence[RestartTransforms] | None = None
                         ) -> list[Reconstruction]:
        """One Reconstruction per observation, every stage of victims x restarts optimised
        together (:func:`~fedleak.attacks.stacked_problems.optimize_vectorised`, in chunks):
        victim v with seed ``self.seed + v`` (and ``trial_transforms[v]``, EOT, in place of
        the adaptive T when given) as the per-victim attack, the same stage chain, l1
        projections, stoppers (a copy per problem and stage) and (restart, stage) choice."""
        check_one_each(trial_transforms, observations)
        self.generator.to(first_of(observations).device)
        return in_chunks(observations, self.restarts, progress, lambda part, begin: (
            self._stacked_chunk(part, begin, None if trial_transforms is None
                                else trial_transforms[begin:begin + len(part)])))

    def _stacked_chunk(self, observations: list[Observation], begin: int,
                       trial_transforms: Sequence[RestartTransforms] | None
                       ) -> list[Reconstruction]:
        start, first = time.perf_counter(), observations[0]
        victims, restarts, shape = len(observations), self.restarts, first.input_shape
        labels = torch.stack([infer_labels(obs) for obs in observations])
        targets = victim_targets(observations)
        if trial_transforms is not None:
            transform = restart_transforms(trial_transforms, restarts)
        else:
            transform = None if self.transform == "none" else per_victim(
                [adaptive_transform(self.transform, obs) for obs in observations], restarts)
        settings = {"distance": "cosine", "regularizers": {"tv": self.tv, "l2": self.image_norm},
                    "transform": transform, "lr": self.lr, "boxed": False}
        scorer = StackedModel(first.model)

        def stage(variable: torch.Tensor, decode: nn.Module, iterations: int,
                  ratio: float | None) -> tuple[BatchedTrajectory, torch.Tensor, torch.Tensor]:
            """One stage of every problem: its run, (V, R) gradient loss, final images."""
            def render(v: torch.Tensor) -> torch.Tensor:
                return to_model_input(decode(v.flatten(0, 1)), shape).unflatten(0, v.shape[:2])

            project = None
            if ratio is not None:  # each image's change within ratio x its start's l1 norm
                origin = variable.flatten(0, 2).clone()
                radius = ratio * origin.flatten(1).abs().sum(1)

                def project(x: torch.Tensor) -> None:
                    rows = x.view_as(origin)
                    rows.copy_(origin + project_l1_ball(rows - origin, radius))

            run = optimize_vectorised(first.model, variable, labels, targets, render=render,
                                      iterations=iterations, lr_factor=ramped(iterations),
                                      project=project,
                                      stoppers=copies(self.stopper, victims * restarts),
                                      **settings)
            with torch.no_grad():
                images = render(run.variables.flatten(0, 1))  # (P, B, C, H, W)
            problem_labels = labels.repeat_interleave(restarts, 0)
            if transform is None:  # products only, as the stage itself
                products = scorer.products(images, problem_labels, targets, residual=False)
            else:
                products = GradientProducts.formed(
                    transform(scorer.gradients(images, problem_labels), images), targets)
            loss = STACKED_DISTANCES["cosine"](products).detach()
            return run, loss.view(victims, restarts), images.clamp(0, 1).unflatten(
                0, (victims, restarts))

        latent = torch.stack([self._latents(obs, torch.Generator().manual_seed(
            self.seed + begin + v)) for v, obs in enumerate(observations)])
        runs = [stage(latent, self.generator, self.steps[0], None)]
        feature = self.blocks[0](runs[0][0].variables.flatten(0, 2)
                                 .view(-1, self.latent_dim, 1, 1))
        for k, iterations in enumerate(self.steps[1:], start=1):
            runs.append(stage(feature.unflatten(0, latent.shape[:3]), nn.Sequential(
                *self.blocks[k:]), iterations, self.radii[k - 1]))
            feature = self.blocks[k](runs[-1][0].variables.flatten(0, 2))
        losses = torch.stack([loss for _, loss, _ in runs], dim=2).cpu()  # (V, R, stages)
        share = (time.perf_counter() - start) / victims
        out = []
        for v in range(victims):
            restart, index = divmod(int(losses[v].flatten().argmin()), len(runs))
            trace = []
            for run, _, _ in runs:
                trace += run.loss_trace[:int(run.iterations[v, restart]), v, restart].tolist()
            last = runs[-1][0]
            reason = ("diverged" if last.diverged[v, restart] else "max_iterations"
                      if last.stop_reasons is None else last.stop_reasons[v][restart])
            out.append(Reconstruction(
                runs[index][2][v, restart], labels[v], trace, len(trace), share, reason,
                restart=restart, extra={"stage": index, "stage_losses": losses[v, restart].tolist(),
                                        "vectorised_problems": victims * restarts}))
        return out

    def _latents(self, obs: Observation, rng: torch.Generator) -> torch.Tensor:
        """The restarts' starting latent codes (R, B, latent), drawn as the loop draws them."""
        return torch.stack([obs.randn((obs.batch_size, self.latent_dim), rng)
                            for _ in range(self.restarts)])
