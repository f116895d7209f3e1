"""Datasets with a task label ``y`` and sensitive attributes (RecUP-FL's attribute inference):
which there are, what each is missing, their stand-ins.

Every loader returns :class:`ImageData` whose ``attributes`` maps a name to (N,) int64
classes ``0..k-1`` (``CLASSES`` lists k per dataset). Nothing is downloaded: a local
dataset that is not there fails before any work with one message naming the path and
how to obtain it (:func:`missing`). The loaders, each described in its module:
``digits_attributes`` and ``mnist_attributes`` (``gradleak.data.digit_attributes``),
``adult`` (``gradleak.data.adult``), ``lfw`` (``gradleak.data.lfw``), ``celeba``
(``gradleak.data.celeba``) and ``audiomnist`` (``gradleak.data.audiomnist``).

Stand-ins (``stand_in``) give each of these the paper's shape (``image_data.SHAPES``), task
class count and attribute classes from the digits: ``digits`` ranks one of five shape
measures (ink, slant, stroke width, bounding-box aspect, vertical centroid; which one per
attribute: ``STAND_IN_MEASURES``) within each digit into k bins, so every attribute is
balanced and independent of y (y: parity for two classes, the digit for ten;
``mnist_attributes``' stand-in is the parity task whatever ``task`` says), and a ``GROUPS``
attribute (LFW's ``identity``) is each distinct combination of the binned attributes, so a
stand-in "person" has one race, gender, age... as a real one has; ``fake`` draws seeded
noise for x, y and the attributes (a group: one of N / 10).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gradleak.data.adult import adult_missing, load_adult
from gradleak.data.attribute_counts import CLASSES, GROUPS
from gradleak.data.audiomnist import audiomnist_missing, load_audiomnist
from gradleak.data.celeba import celeba_missing, load_celeba
from gradleak.data.digit_attributes import (
    load_digits_attributes,
    load_mnist_attributes,
    mnist_attributes_missing,
    shape_measures,
    within_class_bins,
)
from gradleak.data.digits import load_digits
from gradleak.data.image_data import SHAPES, ImageData, to_channels
from gradleak.data.lfw import lfw_missing, load_lfw

LOADERS = {"digits_attributes": load_digits_attributes, "mnist_attributes": load_mnist_attributes,
           "adult": load_adult, "lfw": load_lfw, "celeba": load_celeba,
           "audiomnist": load_audiomnist}
MISSING = {"mnist_attributes": mnist_attributes_missing, "adult": adult_missing,
           "lfw": lfw_missing, "celeba": celeba_missing, "audiomnist": audiomnist_missing}


def missing(name: str, options: dict) -> str | None:
    """Why attribute dataset ``name`` cannot be read from its local root (None: it can)."""
    if name == "digits_attributes":
        return None
    if name not in MISSING:
        raise ValueError(f"unknown attribute dataset {name!r}; expected one of {sorted(CLASSES)}")
    return MISSING[name](options)


FAKE_COUNT = 1000  # samples of a `fake` attribute stand-in (a `digits` one: the digits')

# dataset -> attribute -> the digits' shape measure (``digit_attributes.MEASURES``) whose
# within-digit bins stand in for it; no two attributes of a dataset share one. Chosen by
# docs/measurements.md m97 (Stru-NN and RF on undefended round-0 uploads): LFW race, Adult
# race and CelebA age stay on ink, their best; AudioMNIST identity moves to slant, its best;
# LFW age to the vertical centroid (ink, its best, is race's; centroid ties slant, which
# gender keeps, and is uncorrelated with ink, as stroke = ink / skeleton length is not);
# LFW hair and AudioMNIST native take the measures freed.
STAND_IN_MEASURES = {
    "mnist_attributes": {"ink": "ink", "slant": "slant", "stroke": "stroke", "group": "aspect"},
    "adult": {"race": "ink", "sex": "slant"},
    "lfw": {"race": "ink", "gender": "slant", "age": "centroid", "glasses": "aspect",
            "hair": "stroke"},
    "celeba": {"age": "ink", "smiling": "slant", "eyeglasses": "stroke"},
    "audiomnist": {"gender": "ink", "native": "stroke", "identity": "slant", "accent": "aspect",
                   "age": "centroid"},
}


def stand_in(name: str, kind: str, seed: int = 0) -> ImageData:
    """Bundled data in the shape, task classes and attribute classes of ``name`` (smoke runs):
    ``digits`` (balanced attributes independent of y) or ``fake`` (seeded noise)."""
    if name not in CLASSES or name not in SHAPES:
        raise ValueError(f"no attribute stand-in for {name!r}; expected one of "
                         f"{sorted(set(CLASSES) & set(SHAPES))}")
    channels, height, width, classes = SHAPES[name]
    if kind == "fake":
        g = torch.Generator().manual_seed(seed)
        count = FAKE_COUNT
        x = torch.rand(count, channels, height, width, generator=g)
        y = torch.randint(classes, (count,), generator=g)
        attributes = {a: torch.randint(k, (count,), generator=g) for a, k in CLASSES[name].items()}
        attributes |= {a: torch.randint(count // 10, (count,), generator=g)
                       for a in GROUPS.get(name, ())}
        return ImageData(x, y, classes, attributes)
    if kind != "digits":
        raise ValueError(f"stand_in must be 'digits' or 'fake', got {kind!r}")
    digits = load_digits(1, 32)
    labels, measures = digits.y.numpy(), shape_measures(digits.x)
    attributes = {a: torch.from_numpy(within_class_bins(measures[STAND_IN_MEASURES[name][a]],
                                                        labels, k))
                  for a, k in CLASSES[name].items()}
    for group in GROUPS.get(name, ()):  # a "person": one combination of the attributes
        combos = torch.stack([attributes[a] for a in CLASSES[name]], 1)
        attributes[group] = torch.unique(combos, dim=0, return_inverse=True)[1]
    y = digits.y % 2 if classes == 2 else digits.y % classes
    if height == 1:  # tabular rows: the 32x32 image averaged into ``width`` features
        x = F.adaptive_avg_pool1d(digits.x.flatten(1).unsqueeze(1), width)
        x = x.view(len(digits), 1, 1, width)
    else:
        x = F.interpolate(digits.x, size=(height, width), mode="bilinear", align_corners=False)
        x = to_channels(x, channels)
    return ImageData(x.clamp(0, 1).contiguous(), y, classes, attributes)
