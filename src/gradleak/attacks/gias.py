"""GIAS: gradient inversion in alternative spaces (Jeon et al., NeurIPS 2021, §4.1, App. A Alg. 1).

The cost c (Eqs. 2-3, labels given) is the negative cosine between the trial and the
observed gradient over all layers (Inverting Gradients) plus lambda_TV TV(x). "+BN" adds
lambda_BN R_BN (§4, after Yin et al.; ``bn_statistics.bn_loss``) against the client's exact
batch statistics (``Observation.bn_statistics``, BN_exact), the first layer weighted x10
as in the official code. Variants (Table 1, §5.1):

- ``x``: GI-x, argmin_x c(x) from x ~ N(0, I) (Inverting Gradients: Adam on the
  sign of the gradient, box [0, 1]);
- ``z``: GI-z, the latent space search argmin_z c(G_w(z)) (Eq. 5);
- ``w``: GI-w, the parameter space search argmin_{w_1..w_B} c(G_w1(z_1), ...)
  (Eq. 7) from a fixed random z;
- ``z/w``: GI-z/w (GIAS, Alg. 1): Eq. 5, then Eq. 7 with the found z fixed and
  one copy of the generator per image.
- ``z/x``: GI-z/x (§5.1, Fig. 3): Eq. 5, then GI-x's pixel search starting from the
  image G_w(z*) it found.

The generator is any kind of ``gan.kind`` (``prior.GeneratorPrior``): for StyleGAN2 the
latent search runs in W+ (App. H: "the latent space search over z implies the search over
the intermediate latent space W", k = 512 x 16; ``gan.stylegan2.space``) and the parameter
search copies the synthesis network; BigGAN is conditioned on the inferred labels.

``prior: untrained`` gives the generator variants the prior's architecture with its
initial weights instead of the trained prior (Table 1's GI-w). ``prior_dataset`` names the
dataset the prior is of (None: the configuration's ``gan.dataset``), e.g. a wrong prior
(Fig. 6: a generator trained on CIFAR-10 against FFHQ victims). ``step`` is GIML's.

Defaults (App. H): Adam with lr x0.1 at 3/8, 5/8 and 7/8 of each stage, eta_z = 3e-2,
eta_w = 1e-3, eta_x = 0.1 (Inverting Gradients), lambda_TV = 1e-4, lambda_BN = 1e-4 (the
official code's GradInversion weight), best of 4 restarts by final loss; 1,500 latent
(§5.1), 5,000 parameter (the official script for 32x32 images) and 24,000 image
iterations (Inverting Gradients); z ~ N(0, I); labels inferred; a stopper per stage.

``sparsity`` > 0 is the official "sim_cmpr" cost for sparsified (pruned)
updates: the non-zero entries among the top (1 - sparsity) of each observed
layer form a mask applied to the trial gradient before the cosine. ``sparsity:
observed`` takes each layer's sparsity from the upload itself (its non-zero entries), so
the mask follows whatever pruning level the client applied (§5.2, Fig. 5(b)).

Departures: TV is the anisotropic mean |dx| + mean |dy| of the official code
(Eq. 4 writes squared differences); "+BN" is R_BN alone, without the group-lazy
regulariser of the paper's GradInversion baseline (App. H), which couples
restarts run in lockstep. As in the official code, the restarts of GI-z/w are
those of the latent search: the parameter search runs once, from the best latent
code (for a deterministic generator every restart of that stage is identical); GI-z/x's
pixel search likewise. GI-w draws a new z per restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from gradleak.attacks.base import Attack, register, stopper_from
from gradleak.attacks.bn_statistics import bn_loss, checked, stacked_statistics
from gradleak.attacks.objectives import RESIDUAL_DISTANCES
from gradleak.attacks.prior import (
    GeneratorPrior,
    as_prior,
    frozen_copy,
    latent_dim,
    rendered,
    to_model_input,
)
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stage import Prior, Solution, Stage, image_start
from gradleak.attacks.victims import Victims
from gradleak.config import ConfigError
from gradleak.needs import Need, artifact
from gradleak.types import Observation

MILESTONES = (3 / 8, 5 / 8, 7 / 8)
SPACES = ("x", "z", "w", "z/w", "z/x")
VARIANTS = SPACES + tuple(f"{s}+BN" for s in SPACES)
FIRST_BN_WEIGHT = 10.0


def sparsity_masks(target: Sequence[torch.Tensor], sparsity: float) -> list[torch.Tensor]:
    """Per layer, the non-zero entries among the top ``1 - sparsity`` of |observed gradient|."""
    masks = []
    for g in target:
        k = max(1, int(g.numel() * (1 - sparsity)))
        threshold = g.abs().flatten().kthvalue(g.numel() - k + 1).values  # the k-th largest
        masks.append(((g.abs() >= threshold) & (g != 0)).to(g.dtype))
    return masks


def per_image_generators(generator: GeneratorPrior, input_shape: tuple[int, int, int]
                         ) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """A parameter search's render: each problem's B generator copies (its searched weights,
    ``generator.searched()`` in order, each (P, B, *shape)) map its fixed codes z and
    conditions (the last variables, (P, B, ...)) to images (P, B, ...), image k from copy k."""
    names = generator.searched()

    def one(weights: dict[str, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(generator, weights,
                               tuple(x.unsqueeze(0) for x in inputs)).squeeze(0)

    each = vmap(one)

    def render(variables: list[torch.Tensor]) -> torch.Tensor:
        weights, inputs = variables[:len(names)], variables[len(names):]
        images = each({n: w.flatten(0, 1) for n, w in zip(names, weights)},
                      *(x.flatten(0, 1) for x in inputs))
        return to_model_input(images, input_shape).unflatten(0, inputs[0].shape[:2])

    return render


@register("gias")
class GIAS(Attack):
    """GI-x, GI-z, GI-w and GI-z/w (GIAS), each optionally "+BN" (Table 1).

    ``Reconstruction.extra`` holds the variant, the iterations per stage and, for
    the generator variants, the latent code z (the GI-z result is G(z)).
    """

    needs = {"generator": Need("gan", when={"variant": tuple(v for v in VARIANTS
                                                         if not v.startswith("x"))})}

    @classmethod
    def budget(cls, params: Mapping[str, Any]) -> int:
        """The iterations of the variant's stages (z/w: latent, then parameter search)."""
        stages = {"z": "latent_iterations", "w": "parameter_iterations", "x": "image_iterations"}
        return sum(params[stages[s]] for s in params["variant"].removesuffix("+BN").split("/"))

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """``step`` selects a checkpoint of GIML's generator: GIAS has none."""
        if params.get("step") is not None:
            raise ConfigError(f"invalid config: '{where}.step': {params['step']!r} selects a "
                              f"checkpoint of GIML's meta-learned generator; {cls.name} has "
                              f"none: expected null", key=f"{where}.step")

    @classmethod
    def needs_for(cls, params: Mapping[str, Any]) -> dict[str, str]:
        """The latent variants' generator: the trained prior or its architecture untrained,
        of ``prior_dataset`` (None: the configuration's GAN dataset)."""
        if params.get("step") is not None:
            raise ValueError(f"step {params['step']!r} selects a checkpoint of GIML's "
                             f"meta-learned generator; gias has none: expected step null")
        kind = artifact("gan" if params["prior"] == "trained" else "untrained_gan",
                        params.get("prior_dataset"))
        return {"generator": kind} if cls.needs["generator"].applies(params) else {}

    def __init__(self, *, variant: str, latent_iterations: int, parameter_iterations: int,
                 image_iterations: int, lr_z: float, lr_w: float, lr_x: float, tv: float,
                 bn: float, restarts: int, signed: bool, sparsity: float | str, distance: str,
                 prior: str, prior_dataset: str | None, step: int | None,
                 stopper: dict | None, generator: nn.Module | None = None,
                 seed: int = 0) -> None:
        self.space, self.use_bn = variant.removesuffix("+BN"), variant.endswith("+BN")
        if self.space != "x":
            latent_dim(generator)
        # the generator as searched (its kind's latent, parameters); x: none
        self.interface = None if self.space == "x" else as_prior(generator)
        self.generator, self.variant, self.prior = generator, variant, prior
        self.prior_dataset, self.step = prior_dataset, step
        self.latent_iterations, self.parameter_iterations = latent_iterations, parameter_iterations
        self.image_iterations, self.restarts = image_iterations, restarts
        self.lr_z, self.lr_w, self.lr_x, self.tv, self.bn = lr_z, lr_w, lr_x, tv, bn
        self.signed, self.sparsity, self.distance, self.seed = signed, sparsity, distance, seed
        self.stopper = stopper_from(stopper)
        self.records_snapshots = self.space in ("x", "z")

    @property
    def forms_gradients(self) -> bool:
        """An L2 distance or the sparsified cost forms each stacked trial gradient."""
        return self.distance in RESIDUAL_DISTANCES or self.sparsity != 0

    @property
    def sequences(self) -> bool:
        """App. D's sum over a sequence of uploads: the cost is its stages' alone, unless
        the sparsified cost masks each victim's own upload."""
        return self.sparsity == 0

    def _prior(self, observations: list[Observation], restarts: int) -> Prior:
        """lambda_BN R_BN of the problems against their victims' exact statistics."""
        source = f"variant {self.variant!r}"
        stats = stacked_statistics([checked(obs.bn_statistics, obs.model, source)
                                    for obs in observations], restarts)
        return lambda _, moments: self.bn * bn_loss(moments(), stats, FIRST_BN_WEIGHT)

    def stage(self, victims: Victims, space: str = "x") -> Stage:
        """c of Eq. 3 over images (GI-x), latent codes (Eq. 5) or, from fixed codes, the
        weights of one generator copy per image (Eq. 7)."""
        shape = victims.observations[0].input_shape
        masks = {}
        if self.sparsity != 0:
            names, level = [n for n, _ in victims.model.named_parameters()], (
                0.0 if self.sparsity == "observed" else self.sparsity)  # 0: the non-zeros
            masks = {id(obs): dict(zip(names, sparsity_masks(obs.target_gradient(), level)))
                     for obs in victims.observations}
        common = {"regularizers": {"tv": self.tv}, "milestones": MILESTONES,
                  "prior": self._prior if self.use_bn else None, "stopper": self.stopper,
                  "target": None if not masks else lambda obs: {
                      n: g * masks[id(obs)][n] for n, g in obs.gradient.items()},
                  "transform": None if not masks else lambda obs: lambda trial, _: {
                      n: g * masks[id(obs)][n] for n, g in trial.items()}}
        if space == "x":
            return Stage(self.distance, self.lr_x, self.image_iterations, draw=image_start,
                         signed=self.signed, boxed=True, **common)
        frozen = frozen_copy(self.interface, victims.device)
        if space == "z":
            return Stage(self.distance, self.lr_z, self.latent_iterations, draw=frozen.draw,
                         render=rendered(frozen, shape), fixed=frozen.n_conditions, **common)
        return Stage(self.distance, self.lr_w, self.parameter_iterations,
                     render=per_image_generators(frozen, shape), fixed=1 + frozen.n_conditions,
                     **common)

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        if self.space in ("x", "z"):
            search = victims.solve(self.stage(victims, self.space))
            out = victims.reconstructions(search)
            codes = None if self.space == "x" else search.chosen(search.best_restart())[0]
            return self._noted(out, codes, [{self.space: rec.iterations} for rec in out])
        if self.space == "w":  # every restart: a new random z and its own parameter search
            codes = victims.draw(self.interface.draw)
            out = victims.reconstructions(self._parameters(victims, codes))
            chosen = codes[0][torch.arange(len(out)),
                              torch.tensor([rec.restart for rec in out])]
            return self._noted(out, chosen, [{"w": rec.iterations} for rec in out])
        latent = victims.solve(self.stage(victims, "z"))  # z/w, z/x: from the best z of Eq. 5
        best = latent.best_restart()
        found = latent.chosen(best)  # the latent, then its conditions
        codes = found[0]
        if self.space == "z/w":
            second = self._parameters(victims, [v.unsqueeze(1) for v in found])
        else:
            with torch.no_grad():
                start = latent.stage.images(found).clamp(0, 1)
            second = victims.solve(self.stage(victims, "x"), [start.unsqueeze(1)])
        out = victims.reconstructions(second)
        iterations = []
        for v, rec in enumerate(out):
            first = latent.trace(v, int(best[v]))
            iterations.append({"z": len(first), self.space[-1]: rec.iterations})
            rec.loss_trace, rec.iterations = first + rec.loss_trace, len(first) + rec.iterations
            rec.restart = int(best[v])
        return self._noted(out, codes, iterations)

    def _parameters(self, victims: Victims, codes: list[torch.Tensor]) -> Solution:
        """Eq. 7 for every problem from its fixed codes (V, R, B, ...) and conditions, the
        generator copies starting at the pretrained weights."""
        weights = dict(self.interface.named_parameters())
        starts = [weights[n].detach().to(victims.device).expand(*codes[0].shape[:3],
                                                                *weights[n].shape).clone()
                  for n in self.interface.searched()]
        return victims.solve(self.stage(victims, "w"), starts + list(codes))

    def _noted(self, out: list[Reconstruction], codes: torch.Tensor | None,
               iterations: list[dict[str, int]]) -> list[Reconstruction]:
        for v, rec in enumerate(out):
            rec.extra.update(variant=self.variant, iterations=iterations[v])
            if codes is not None:
                rec.extra["latent"] = codes[v].cpu()
        return out
