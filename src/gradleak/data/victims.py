"""Which images of a prepared split an attack's victims are (the ``attack:`` section).

By default the victims are ``attack.victims.count`` disjoint batches of
``attack.protocol.batch_size`` images drawn at random from the train split
(``experiment.victims.victim_batches``). Two options choose them as CENSOR (Zhang et al.,
NDSS 2025) does:

- ``attack.victims.split`` and ``attack.victims.stride`` (§V-B: "for each attack, we
  perform the gradient inversion on ten different images for every 1000-th image of
  ImageNet, FFHQ and CIFAR-10 validation set"): the images at positions 0, s, 2s, ... of
  the split (``test``: the held-out images no FL client trains on), victim v's batch the B
  of them at positions v B .. v B + B - 1 of that sequence.
- ``attack.victims.class`` (§III, Observation 2, Fig. 3: "six different training instances
  of the class bird"): only images of that class, at a stride or at random.

:func:`problem` says, from a prepared dataset's per-split class counts (its manifest),
why a spec cannot draw its victims, before any model is loaded or upload made.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def pool(labels: np.ndarray, spec: Mapping) -> np.ndarray:
    """The positions in the split that victims may be: every image, or those of
    ``victims.class``."""
    if spec["victims"]["class"] is None:
        return np.arange(len(labels))
    return np.flatnonzero(labels == spec["victims"]["class"])


def strided(labels: np.ndarray, spec: Mapping) -> list[np.ndarray]:
    """``victims.count`` batches of ``protocol.batch_size`` positions: every
    ``victims.stride``-th image of the pool from its first, in order (CENSOR §V-B)."""
    count, size, stride = _sizes(spec)
    chosen = pool(labels, spec)[np.arange(count * size) * stride]
    return [np.sort(chosen[v * size:(v + 1) * size]) for v in range(count)]


def of_class(labels: np.ndarray, spec: Mapping, rng: np.random.Generator) -> list[np.ndarray]:
    """``victims.count`` disjoint batches drawn at random from the images of
    ``victims.class``."""
    count, size, _ = _sizes(spec)
    eligible = pool(labels, spec)
    chosen = eligible[rng.choice(len(eligible), count * size, replace=False)]
    return [np.sort(chosen[v * size:(v + 1) * size]) for v in range(count)]


def _sizes(spec: Mapping) -> tuple[int, int, int]:
    """(victims, images per victim, stride) of an ``attack:`` section."""
    return (spec["victims"]["count"], spec["protocol"]["batch_size"],
            spec["victims"]["stride"])


def _classes(counts: list[int]) -> str:
    present = [c for c, n in enumerate(counts) if n]
    shown = ", ".join(map(str, present[:10])) + (", ..." if len(present) > 10 else "")
    return f"{len(present)} classes ({shown})"


def problem(spec: Mapping, class_counts: Mapping[str, list[int]], dataset: str) -> str | None:
    """Why the ``attack:`` section ``spec`` cannot draw its victims (and, with ``mixed``,
    the other client's batches) from a prepared dataset whose split -> per-class image
    counts are ``class_counts``; None when it can."""
    count, size, stride = _sizes(spec)
    split, label = spec["victims"]["split"], spec["victims"]["class"]
    mixed, steps = spec["protocol"]["mixed"]["batch_size"], spec["protocol"]["sequence"]["steps"]
    if stride and spec["victims"]["distinct_labels"]:
        return (f"'attack.victims.stride' {stride} takes fixed images, but "
                f"'attack.victims.distinct_labels' draws batches of different labels at random; "
                f"expected one of them ('attack.victims.stride': 0 or "
                f"'attack.victims.distinct_labels': false)")
    if label is not None and spec["victims"]["distinct_labels"] and size > 1:
        return (f"'attack.victims.class' {label} gives every image of a batch one label, but "
                f"'attack.victims.distinct_labels' asks for {size} different labels; expected "
                f"one of them")
    if mixed and steps:
        return (f"'attack.protocol.mixed.batch_size' {mixed} (CENSOR Fig. 2: two clients' "
                f"rounds) and 'attack.protocol.sequence.steps' {steps} (GIAS App. D) each make "
                f"the victim's uploads; expected one of them")
    if split not in class_counts:
        return (f"'attack.victims.split' {split!r} is not a split of the prepared {dataset!r}; "
                f"expected one of {sorted(class_counts)}")
    counts = class_counts[split]
    where = f"the {split} split of {dataset!r}"
    if label is not None:
        if label >= len(counts) or not counts[label]:
            return (f"'attack.victims.class' {label}: {where} has no image of class {label}; "
                    f"expected one of its {_classes(counts)}")
        available, where = counts[label], f"{where} (class {label})"
    else:
        available = sum(counts)
    wanted = count * size
    if stride and (wanted - 1) * stride + 1 > available:
        most = (available - 1) // max(wanted - 1, 1)
        return (f"'attack.victims.stride' {stride}: {count} victims x batch_size {size}, every "
                f"{stride}th image, need {(wanted - 1) * stride + 1} images, but {where} holds "
                f"{available}; expected a stride of at most {most} or fewer victims")
    if not stride and wanted > available:
        return (f"'attack.victims.count' x 'attack.protocol.batch_size' = {count} x {size} = "
                f"{wanted} distinct images, but {where} holds {available}; expected fewer "
                f"victims or a smaller batch")
    if mixed:
        others = sum(class_counts.get("train", [])) - (wanted if split == "train" else 0)
        if mixed > others:
            return (f"'attack.protocol.mixed.batch_size' {mixed}: the other client's batch is "
                    f"drawn from the train split of {dataset!r} without the victims' images, "
                    f"which holds {others}; expected at most {others}")
    return None
