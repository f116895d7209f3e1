"""The attack engine: an attack's optimisation, stated once as a :class:`Stage` (what it
optimises, its render, distance, regularisers, prior, projection, schedule, stopper), run
for the victims of one FL round stacked or one problem at a time. A
multi-stage attack solves a sequence of stages, each starting where the last one ended.

:func:`reconstruct_all` hands the attack its victims in chunks (:class:`Victims`) and picks
**stacked** where more than one problem runs, the model's parametrised layers stack
(``stacked_layers.unsupported``) and, for an attack whose trial gradients are formed
(``forms_gradients``), forming them pays (``stacked_gradients.forming_pays``): the
P = victims x restarts problems' images then run as
one batch through ``StackedModel``, in chunks of ``StackedModel.problems_per_step``.
Otherwise each problem's trial gradient comes from autograd on the model, one victim a
chunk; ``attack(obs)`` is that with P = restarts. Either way Adam steps the P problems
together (element-wise, so each moves as if alone; one that diverges or whose stopper
fires is frozen there) and L-BFGS problems keep their own optimiser, evaluated together
(``lockstep.in_lockstep``). Victim v draws its restarts' starts in turn from a generator
seeded ``attack.seed + v``, as the attack built with that seed does on it alone. A victim
that is a sequence of uploads of its images (``gradient_sequence.ObservedSequence``, GIAS
App. D) has a stage's loss summed over its uploads, each on its images. A FedAvg upload
(``Observation.local_steps`` > 1) is matched by the trial's local steps, unrolled
(``unrolled``), formed when stacked; one of several epochs attacked through per-epoch
copies (``epoch_copies.EpochCopies``) adds their prior and is merged at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

import torch
from tqdm import tqdm

from gradleak.attacks.bn_statistics import batchnorm_layers
from gradleak.attacks.epoch_copies import EpochCopies, merged
from gradleak.attacks.gradient_sequence import ObservedSequence, mismatch
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stacked_gradients import StackedModel, forming_pays
from gradleak.attacks.stacked_layers import unsupported
from gradleak.attacks.victims import Victims
from gradleak.types import Observation


class Scheduled(Protocol):
    """What the engine reads of an attack (``base.Attack``, whose ``attack(obs)`` runs
    this module: the engine names no attack class)."""

    restarts: int
    seed: int
    forms_gradients: bool
    vectorisable: bool
    records_snapshots: bool
    sequences: bool

    def reconstruct(self, victims: Victims) -> list[Reconstruction]: ...


ENGINES = ("auto", "stacked", "loop")
# (first victim of a chunk, how to attack the chunk) -> its reconstructions
Kept = Callable[[int, Callable[[], list[Reconstruction]]], list[Reconstruction]]


def stacks(attack: Scheduled, observations: Sequence[Observation]) -> bool:
    """Whether the observations' problems run stacked (the module docstring's rules)."""
    first = observations[0]
    formed = attack.forms_gradients or first.local_steps > 1  # FedAvg: unrolled, formed
    # train-mode BatchNorm updates its running statistics, which vmap cannot do in place
    training_bn = first.local_steps > 1 and first.model.training and batchnorm_layers(first.model)
    return (len(observations) * attack.restarts > 1 and not unsupported(first.model)
            and (not formed or forming_pays(first.model)) and not training_bn
            and not _mixed(observations))


def _mixed(observations: Sequence[Observation]) -> str | None:
    """Why the observations cannot stack (another model object, batch size or input shape)."""
    first = observations[0]
    for v, obs in enumerate(observations):
        if obs.model is not first.model:
            return (f"observation {v} has another model object; expected the same model for "
                    "every observation")
        if (obs.batch_size, obs.input_shape) != (first.batch_size, first.input_shape):
            return (f"observation {v} has batch_size {obs.batch_size} and input_shape "
                    f"{obs.input_shape}; expected {first.batch_size} and "
                    f"{first.input_shape} like observation 0")
        if (obs.local_steps, obs.local_lr) != (first.local_steps, first.local_lr):
            return (f"observation {v} is an upload of {obs.local_steps} local steps at lr "
                    f"{obs.local_lr}; expected {first.local_steps} at {first.local_lr} like "
                    f"observation 0")
    return mismatch(observations)


def reconstruct_all(attack: Scheduled, observations: list[Observation],
                    snapshots: Collection[int] = (), progress: str | None = None,
                    engine: str = "auto", kept: Kept | None = None) -> list[Reconstruction]:
    """One Reconstruction per observation (victim), victim v attacked with seed
    ``attack.seed + v``: ``engine`` "auto" stacks where the module docstring's rules say it
    pays, "stacked" or "loop" forces one way. A progress bar (per chunk of victims, with an
    ETA) is labelled ``progress``; ``wall_time`` is a victim's share of its chunk.
    ``snapshots`` asks for the images at those iterations (single-stage attacks).
    ``kept(begin, run)``: the chunk of victims from ``begin`` as a killed job kept it, else
    ``run()`` (a job resumes: ``experiment.resume``)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if not observations:
        return []
    if snapshots and not attack.records_snapshots:
        raise ValueError(f"{type(attack).__name__} cannot record snapshots (they are one "
                         f"stage's); expected attack.outputs.snapshots: [] for it")
    if not attack.sequences and any(isinstance(o, ObservedSequence) for o in observations):
        raise ValueError(f"{type(attack).__name__} cannot attack a sequence of uploads (GIAS "
                         f"App. D); expected single uploads, or an attack whose cost sums over "
                         f"a sequence (inverting_gradients; gias, giml with sparsity 0)")
    if engine == "stacked" and (why := _mixed(observations)):
        raise ValueError(why)
    stacked = engine == "stacked" or (engine == "auto" and stacks(attack, observations))
    first = observations[0]
    chunk = 1
    if stacked and attack.vectorisable:
        probe = torch.zeros(first.batch_size, *first.input_shape, device=first.device)
        chunk = max(1, StackedModel(first.model).problems_per_step(probe) // attack.restarts)
    out: list[Reconstruction] = []
    with tqdm(total=len(observations), desc=progress, unit="victim",
              disable=progress is None, leave=False) as bar:
        for begin in range(0, len(observations), chunk):
            part = observations[begin:begin + chunk]

            def run(part=part, begin=begin) -> list[Reconstruction]:
                start = time.perf_counter()
                recs = attack.reconstruct(Victims(part, restarts=attack.restarts,
                                                  seed=attack.seed + begin, stacked=stacked,
                                                  snapshots=snapshots))
                share = (time.perf_counter() - start) / len(part)
                for rec in recs:
                    rec.wall_time = share
                    if stacked:
                        rec.extra["vectorised_problems"] = len(part) * attack.restarts
                return recs
            out += run() if kept is None else kept(begin, run)
            bar.update(len(part))
    return [merged(rec, obs.epochs) if isinstance(obs, EpochCopies) else rec
            for rec, obs in zip(out, observations)]

