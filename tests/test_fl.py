"""FedAvg on real digits: the undefended run learns, every defense at its strongest
setting (from the embedded default config) costs accuracy."""

import numpy as np
import pytest

from gradleak import data, defenses
from gradleak.experiment import configuration
from gradleak.fl.server import FLSettings, run_federated
from gradleak.models import LeNet

EMBEDDED = configuration.load(__import__("conftest").REPO / "config" / "config.yaml")
SETTINGS = FLSettings.from_config(EMBEDDED["fl"])


SIZE = EMBEDDED["datasets"]["digits"]["size"]


@pytest.fixture(scope="module")
def split():
    digits = data.load_digits(channels=1, size=SIZE)
    parts = data.stratified_splits(digits.y.numpy(), {"train": 0.6, "public": 0.2, "test": 0.2}, 0)
    pick = lambda name: data.ImageData(digits.x[parts[name]], digits.y[parts[name]], 10)  # noqa: E731
    return pick("train"), pick("test")


@pytest.fixture(scope="module")
def evalnet():
    """Refiner's evaluation network at the embedded default's image size."""
    import torch.nn.functional as F

    from gradleak.models.evalnet import train_evaluation_network

    natural = data.load_natural(2000, seed=0, channels=1)
    images = F.interpolate(natural.x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    net, _ = train_evaluation_network(images, epochs=3, batch_size=128, lr=1e-3, seed=0,
                                      widths=(32, 64, 128),
                                      progress=False)
    return net


def federated_accuracy(split, defense) -> float:
    import torch

    train, test = split
    torch.manual_seed(0)
    shards = data.iid_partition(len(train), 10, np.random.default_rng(0))
    history = run_federated(LeNet(1, 10, SIZE), train, test, shards, defense, SETTINGS, seed=0,
                            progress=False)
    return history[-1]["accuracy"]


@pytest.fixture(scope="module")
def undefended(split):
    return federated_accuracy(split, defenses.build("none"))


def test_fedavg_without_defense_reaches_90_percent(undefended):
    assert undefended >= 0.90


# Not asserted: per-layer clipping and Soteria (measured at 16x16: 0.9415 and 0.9276
# against 0.9109 undefended). FedAdam divides each coordinate by its running RMS, so
# it is blind to per-layer rescaling, and Soteria leaves the fc bias and every other
# layer intact; their accuracy is reported by the pipeline, not bounded here.
NOT_COSTLY_UNDER_FEDADAM = {"clipping", "soteria"}
# RecUP-FL perturbs only what its model zoo reads (needs a zoo and the batch's attributes):
# its learning loss is measured by the attribute track (docs/recupfl.md), not bounded here.
ATTRIBUTE_DEFENSES = {"recupfl"}


# The labelled CENSOR readings (censor_alg1, censor_official) fall back to the clean gradient
# when no orthogonal trial lowers the loss: whether they cost accuracy is what the embedded
# default measures (docs/censor.md), not a bound.
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(
    label for label, entry in EMBEDDED["defenses"].items()
    if "defense" not in entry
    and label not in {"none", *NOT_COSTLY_UNDER_FEDADAM, *ATTRIBUTE_DEFENSES}))
def test_strongest_defense_costs_accuracy(split, undefended, name, request):
    spec = EMBEDDED["defenses"][name]
    strength = defenses.strongest(name, spec["strengths"])
    params = dict(spec.get("params", {}))
    if name == "refiner":
        params["evalnet"] = request.getfixturevalue("evalnet")
    defense = defenses.build_at(name, strength, **params)
    defended = federated_accuracy(split, defense)
    print(f"{name}={strength}: accuracy {defended:.4f} vs undefended {undefended:.4f}")
    assert defended < undefended

