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
samples are weighted equally. A sample is the defense's adaptive transformation
(``Defense.adaptive``, decision 0072, given the received upload): for pruning, clipping,
and Soteria their known transformation (GGL, Li et al. CVPR 2022 §3.3; the received zero
pattern, the bound, Soteria's pruned columns left out); for unbiased QSGD and zero-mean
noise the upload's expectation (the trial, clipped for DP); for the others a draw of the
defense (``Defense.sample``), by default the defense called on the trial gradient, so it
must be differentiable in it (noise is).
Refiner's upload is the gradient of optimised robust data, not a function of the trial
gradient that can be sampled: against it EOT matches the trial gradient itself (the plain
attack; ``Refiner.sample``). A defense whose transformation has no randomness
(``Defense.deterministic``) is sampled once, whatever ``samples`` says.

``applies`` (decision 0107): the attacker applies a defense whose transformation is a function
of the gradient alone (clipping, the schema's one choice) to the received upload itself
and attacks through it, as the adaptive attacker does through the defended upload. On a
clean upload this is the adaptive attack on that defense's upload, so no such defense's
curve starts above the undefended point's strongest attacker.

Wraps any registered attack (``inverting_gradients``, ``gga``, ``gifd``, ...): ``wraps``
names it and ``wraps_params`` sets its parameters; the artifacts it needs (a GAN prior for
``gga``/``gifd``) are passed to EOT by name. Restart r of every victim draws its defense
samples from a generator seeded by (seed, r), however the engine runs it: common random
numbers, so at each step the victims draw alike (each victim's draws are still fresh at
every step, which is all EOT asks of them). Stacked victims' draws are made together
(``Defense.adaptive_many``), and against RecUP-FL, where a draw is the zoo models each
meta-step samples, victims drawing alike pass through one model at a time together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from gradleak.attacks.base import Attack, build, needs, register, registered
from gradleak.attacks.label_inference import infer_labels
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stage import RestartTransforms
from gradleak.attacks.victims import Victims
from gradleak.defenses import Defense
from gradleak.defenses import build as build_defense
from gradleak.types import DefenseContext, Observation, Update
from gradleak.utils.seeding import derived_seed


class DefenseSamples:
    """T(F(x)) = the mean of ``samples`` draws of ``defense`` applied to the trial gradient."""

    def __init__(self, defense: Defense, obs: Observation, labels: torch.Tensor, samples: int,
                 rng: torch.Generator) -> None:
        self.defense, self.obs, self.labels = defense, obs, labels
        self.samples, self.rng = samples, rng

    def __call__(self, trial: Update, images: torch.Tensor) -> Update:
        return self.together([self], [trial], [images])[0]

    @staticmethod
    def together(problems: Sequence[DefenseSamples], trials: Sequence[Update],
                 images: Sequence[torch.Tensor]) -> list[Update]:
        """Each problem's T(F(x)), the draws of all problems made at once
        (``Defense.adaptive_many``), problem p drawing with its own generator as if alone."""
        defense, samples = problems[0].defense, problems[0].samples
        if any(p.defense is not defense or p.samples != samples for p in problems):
            raise ValueError("EOT's problems run together must share one defense and one "
                             "number of samples")
        draws = []
        for _ in range(samples):
            ctxs = [DefenseContext(p.obs.model, x.detach(), p.labels, p.rng)
                    for p, x in zip(problems, images)]
            out = defense.adaptive_many([Update(t) for t in trials], ctxs,
                                        [p.obs.gradient for p in problems])
            for trial, drawn in zip(trials, out):
                if any(g.requires_grad for g in trial.values()) and not any(
                        g.requires_grad for g in drawn.values()):
                    raise ValueError(f"EOT needs a defense differentiable in the gradient it "
                                     f"is given; {type(defense).__name__} detaches it")
            draws.append(out)
        return [Update({k: torch.stack([d[p][k] for d in draws]).mean(dim=0) for k in trial})
                for p, trial in enumerate(trials)]


@register("eot")
class ExpectationOverTransformation(Attack):
    """``wraps`` matching the mean of ``samples`` draws of ``defense`` on its trial gradient."""

    forms_gradients = True  # each problem's trial gradient is formed for its samples
    records_snapshots = False

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """The wrapped attack's rules, on its parameters."""
        registered(params["wraps"]).check_config(params["wraps_params"], config,
                                                 f"{where}.wraps_params")

    @classmethod
    def needs_for(cls, params: Mapping[str, Any]) -> dict[str, str]:
        wrapped = needs(params["wraps"], params["wraps_params"])
        return wrapped if (params.get("applies") or {}).get("defense") else \
            {"defense": "defense", **wrapped}

    @classmethod
    def budget(cls, params: Mapping[str, Any]) -> int:
        """The wrapped attack's, on each of ``samples`` defense draws (its restarts too)."""
        wrapped = params["wraps_params"]
        return params["samples"] * registered(params["wraps"]).budget(wrapped) \
            * wrapped.get("restarts", 1)

    def __init__(self, *, wraps: str, wraps_params: dict, samples: int, applies: Mapping,
                 defense: str | Defense | None = None, seed: int = 0,
                 **artifacts: Any) -> None:
        applies = applies if applies.get("defense") else {}
        if applies:
            defense = build_defense(applies["defense"], **applies.get("params", {}))
        if isinstance(defense, str):
            defense = build_defense(defense)
        if not isinstance(defense, Defense):
            raise ValueError(f"defense must be a registered name or a Defense, "
                             f"got {type(defense).__name__}")
        self.attack, self.defense = build(wraps, **wraps_params, **artifacts), defense
        self.applies = applies
        self.samples, self.seed = int(samples), seed
        self.restarts, self.stopper = self.attack.restarts, self.attack.stopper
        self.vectorisable = self.attack.vectorisable

    @property
    def draws(self) -> int:
        """Defense samples averaged per step: ``samples``, one of a deterministic defense."""
        return 1 if self.defense.deterministic else self.samples

    def samples_for(self, obs: Observation) -> RestartTransforms:
        """Restart r's defense samples on ``obs``, drawn with a generator seeded (seed, r)."""
        labels = infer_labels(obs)
        return lambda restart: DefenseSamples(
            self.defense, obs, labels, self.draws,
            torch.Generator().manual_seed(derived_seed(self.seed, restart)))

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        """The wrapped attack on the chunk, each victim's trial gradients through its
        samples (and its upload through ``applies``' defense first)."""
        observations = victims.observations
        if self.applies:  # clipping's transformation reads no batch
            observations = [replace(obs, gradient=self.defense.adaptive(
                obs.gradient, None, obs.gradient)) for obs in observations]
        samples = [self.samples_for(obs) for obs in observations]
        out = self.attack.reconstruct(victims.with_transforms(samples, observations))
        for rec in out:
            rec.extra.update(eot_samples=self.draws, eot_defense=self.defense.name)
        return out
