"""Inversion from a sequence of gradients (GIAS, Jeon et al., NeurIPS 2021, App. D, Fig. A3).

A client holds B local images and uploads T gradients of them: at step t the gradient of a
subset S_t of its images under the model theta_t of that step (Fig. A3: B = 8, |S_t| = 4,
theta_t re-initialised every step or trained by the client's own steps). An attacker who
knows which images each upload used ("once we obtain the meta information to match
gradients and data", App. D) solves

    min_x  sum_{t=1}^T c(x[S_t]; theta_t, g_t)

over all B images at once, c being the attack's cost of one upload (Inverting Gradients':
the cosine distance plus TV). :class:`ObservedSequence` is such a victim: an Observation of
the B images whose ``steps`` are the T uploads' own Observations (theta_t, g_t, |S_t|
images, their labels) and whose ``subsets`` are the S_t. The engine sums a stage's loss,
regularisers and prior included, over the steps (``victims.Victims.loss``), so an attack that
states its cost as stages on the victims' uploads (``Attack.sequences``) runs on a sequence
as it is; its reconstruction is the B images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gradleak.types import Observation


@dataclass(eq=False)
class ObservedSequence(Observation):
    """A client's B = ``batch_size`` local images seen through T uploads: ``steps[t]`` the
    Observation of upload t (its model theta_t, gradient g_t, ``len(subsets[t])`` images),
    ``subsets[t]`` the indices of those images among the B. ``labels`` (B,) are required
    (the attacker matches each upload to its images); ``model`` and ``gradient`` are the
    first upload's."""

    steps: Sequence[Observation] = ()
    subsets: Sequence[tuple[int, ...]] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.steps:
            raise ValueError("an ObservedSequence needs at least one step (upload); got none")
        if len(self.subsets) != len(self.steps):
            raise ValueError(f"an ObservedSequence needs one subset per step; got "
                             f"{len(self.subsets)} subsets for {len(self.steps)} steps")
        if self.labels is None:
            raise ValueError("an ObservedSequence needs the labels of its "
                             f"{self.batch_size} local images (GIAS App. D: the attacker "
                             "matches each upload to its images); got labels=None")
        self.steps, self.subsets = list(self.steps), [tuple(int(i) for i in s)
                                                      for s in self.subsets]
        for t, (step, subset) in enumerate(zip(self.steps, self.subsets)):
            if not isinstance(step, Observation) or isinstance(step, ObservedSequence):
                raise TypeError(f"ObservedSequence step {t} must be an Observation of one "
                                f"upload, got {type(step).__name__}")
            if (len(set(subset)) != len(subset) or not subset
                    or min(subset) < 0 or max(subset) >= self.batch_size):
                raise ValueError(f"ObservedSequence subset {t} {list(subset)} must be distinct "
                                 f"indices in [0, {self.batch_size}) of the local images")
            if step.batch_size != len(subset) or step.input_shape != self.input_shape:
                raise ValueError(f"ObservedSequence step {t} has batch_size {step.batch_size} "
                                 f"and input_shape {step.input_shape}; expected "
                                 f"{len(subset)} (its subset) and {self.input_shape}")
            own = self.labels.cpu()[list(subset)]
            if step.labels is not None and not torch.equal(step.labels.cpu(), own):
                raise ValueError(f"ObservedSequence step {t} has labels "
                                 f"{step.labels.tolist()}; expected {own.tolist()}, those of "
                                 f"its subset {list(subset)}")


def models(observations: Sequence[Observation]) -> list[nn.Module]:
    """Every model the observations were made under (a sequence's step models too), once."""
    out: dict[int, nn.Module] = {}
    for obs in observations:
        for model in [obs.model, *(s.model for s in getattr(obs, "steps", ()))]:
            out.setdefault(id(model), model)
    return list(out.values())


def mismatch(observations: Sequence[Observation]) -> str | None:
    """Why sequence observations cannot stack as one problem set (None: they can): each
    step's model must be one object and each subset of one size across the victims."""
    first = observations[0]
    kinds = [isinstance(obs, ObservedSequence) for obs in observations]
    if not any(kinds):
        return None
    if not all(kinds):
        return (f"observation {kinds.index(not kinds[0])} is "
                f"{'one upload' if kinds[0] else 'a sequence'} and observation 0 "
                f"{'a sequence' if kinds[0] else 'one upload'}; expected sequences only or "
                "single uploads only")
    for v, obs in enumerate(observations):
        if len(obs.steps) != len(first.steps):
            return (f"observation {v} has {len(obs.steps)} steps; expected "
                    f"{len(first.steps)} like observation 0")
        for t, (step, subset) in enumerate(zip(obs.steps, obs.subsets)):
            if step.model is not first.steps[t].model:
                return (f"step {t} of observation {v} has another model object than "
                        f"observation 0's (a trained theta is each client's own)")
            if len(subset) != len(first.subsets[t]):
                return (f"step {t} of observation {v} uses {len(subset)} images; expected "
                        f"{len(first.subsets[t])} like observation 0")
    return None
