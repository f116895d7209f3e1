"""Expectation over Transformation (EOT), the adaptive attack of CENSOR §V-D (Zhang et al.,
NDSS 2025), after Athalye et al. (ICML 2018).

A gradient-matching attack normally matches its trial gradient F(x) to the received
gradient g. Under a stochastic defense D, EOT instead "perform[s] the gradient
transformation multiple times, and take[s] the average gradient over several runs"
(§V-D): at every step the trial gradient goes through S independent samples of D, the
defense applied to the trial batch with F(x) as its gradient, and the attack matches

    (1/S) sum_s D_s(F(x))   to   g

with its own distance (L2 for GGA, cosine for GIFD and Inverting Gradients). For CENSOR
the attacker "follows the sampling methodology used by Censor's defense algorithm,
generating orthogonal gradients and subsequently normalizing them in the same manner" and
averages them "over the number of trials": a sample is Eq. 12 applied to F(x) layer by
layer, without CENSOR's loss-based choice among its trials (not differentiable, and not
part of §V-D's description), and S defaults to CENSOR's T = 20. The paper's unspecified
refinement that "prioritize[s] gradients that are more informative" is not implemented:
samples are weighted equally. Other defenses are sampled by calling them, so they must be
differentiable in the gradient they are given (noise, clipping, pruning, quantisation and
Soteria are). Refiner's upload is the gradient of optimised robust data, not a function of
the trial gradient that can be sampled: against it EOT matches the trial gradient itself
(the plain attack), and records that in ``extra["eot_identity"]``.

Wraps any attack whose ``__call__`` accepts ``trial_transform`` (``inverting_gradients``,
``gga``, ``gifd``).
"""

from __future__ import annotations

import inspect

import torch

from fedleak.attacks.base import Attack, Observation, Reconstruction, build, register
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.label_inference import infer_labels
from fedleak.defenses import Defense, DefenseContext
from fedleak.defenses import build as build_defense
from fedleak.defenses.censor import Censor
from fedleak.defenses.refiner import Refiner
from fedleak.fl.client import Update


def _with_hook(attack: Attack) -> Attack:
    """``attack`` itself, after checking that its ``__call__`` accepts ``trial_transform``."""
    if "trial_transform" not in inspect.signature(attack.__call__).parameters:
        raise ValueError(f"EOT needs an attack whose __call__ accepts trial_transform (gga, gifd) "
                         f"or inverting_gradients, got {type(attack).__name__}")
    return attack


class DefenseSamples:
    """T(F(x)) = the mean of ``samples`` draws of ``defense`` applied to the trial gradient."""

    def __init__(self, defense: Defense, obs: Observation, labels: torch.Tensor, samples: int,
                 generator: torch.Generator) -> None:
        self.defense, self.obs, self.labels = defense, obs, labels
        self.samples, self.generator = samples, generator

    def draw(self, trial: Update, images: torch.Tensor) -> Update:
        if isinstance(self.defense, Censor):
            return self.defense.candidate(trial, self.obs.model, len(images), self.generator)
        if isinstance(self.defense, Refiner):  # see the module docstring
            return trial
        ctx = DefenseContext(model=self.obs.model, x=images.detach(), y=self.labels,
                             generator=self.generator, gradient=trial)
        out = self.defense(ctx)
        if any(g.requires_grad for g in trial.values()) and not any(
                g.requires_grad for g in out.values()):
            raise ValueError(f"EOT needs a defense differentiable in the gradient it is given; "
                             f"{type(self.defense).__name__} detaches it")
        return out

    def __call__(self, trial: Update, images: torch.Tensor) -> Update:
        draws = [self.draw(trial, images) for _ in range(self.samples)]
        return {k: torch.stack([d[k] for d in draws]).mean(dim=0) for k in trial}


@register("eot")
class ExpectationOverTransformation:
    """``attack`` matching the mean of ``samples`` draws of ``defense`` on its trial gradient."""

    def __init__(self, attack: str | Attack, defense: str | Defense, samples: int = 20,
                 seed: int = 0, attack_params: dict | None = None,
                 defense_params: dict | None = None) -> None:
        if int(samples) != samples or samples < 1:
            raise ValueError(f"samples must be an integer >= 1, got {samples}")
        if isinstance(attack, str):
            attack = build(attack, **(attack_params or {}))
        elif attack_params:
            raise ValueError("attack_params only apply when attack is given by name")
        if isinstance(defense, str):
            defense = build_defense(defense, **(defense_params or {}))
        elif defense_params:
            raise ValueError("defense_params only apply when defense is given by name")
        if not isinstance(defense, Defense):
            raise ValueError(f"defense must be a registered name or a Defense, "
                             f"got {type(defense).__name__}")
        self.attack, self.defense = _with_hook(attack), defense
        self.samples, self.seed = int(samples), seed

    def __call__(self, obs: Observation, stopper: Stopper | None = None) -> Reconstruction:
        transform = DefenseSamples(self.defense, obs, infer_labels(obs), self.samples,
                                   torch.Generator().manual_seed(self.seed))
        rec = self.attack(obs, stopper, trial_transform=transform)
        rec.extra = {**rec.extra, "eot_samples": self.samples, "eot_defense": self.defense.name,
                     "eot_identity": isinstance(self.defense, Refiner)}
        return rec
