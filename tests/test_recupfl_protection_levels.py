"""RecUP-FL's protection levels (Cui et al., Eq. 9): gamma moves the perturbation's
protection between two attributes of digits (``ink`` and ``slant``, terciles within each
digit class), as a clean-trained Stru-NN adversary reads them."""

from __future__ import annotations

import pytest
import torch
from test_recupfl import SIZE

from gradleak import adversaries, data, defenses
from gradleak.adversaries import features_of, gradient_features, train_zoo
from gradleak.models import LeNet
from gradleak.types import DefenseContext


@pytest.fixture(scope="module")
def two_attributes():
    """Digits at 16x16 with the dataset's ``ink`` and ``slant`` (terciles within each digit
    class), a LeNet's per-sample gradient features (500 to train, 150 to test), a zoo for
    both attributes and a Stru-NN adversary per attribute trained on clean features."""
    digits = data.load("digits", channels=1, size=16)
    perm = torch.randperm(len(digits.x), generator=torch.Generator().manual_seed(1))[:650]
    x, y = digits.x[perm], digits.y[perm]
    attrs = {a: digits.attributes[a][perm] for a in ("ink", "slant")}
    torch.manual_seed(0)
    model = LeNet(1, 10, 16)
    feats = features_of(model, x, y, SIZE)
    train, test = torch.arange(0, 500), torch.arange(500, 650)
    zoo = train_zoo(feats[train], {a: v[train] for a, v in attrs.items()},
                    {"ink": 3, "slant": 3}, size=6, epochs=10, widths=(32, 128), seed=0)
    advs = {a: adversaries.build("stru_nn", epochs=30).fit(feats[train], v[train])
            for a, v in attrs.items()}
    return dict(x=x, y=y, attrs=attrs, model=model, test=test, zoo=zoo, adversaries=advs)


@pytest.mark.slow
def test_gamma_moves_protection_from_one_attribute_to_the_other(two_attributes):
    """Eq. 9 at a fixed epsilon (P = 2 to stay fast): as gamma_ink goes 0 -> 1 and
    gamma_slant = 1 - gamma_ink, a clean-trained Stru-NN reads ink worse and slant better."""
    s = two_attributes
    asr: dict[str, list[float]] = {"ink": [], "slant": []}
    for gamma in (0.0, 0.25, 0.5, 0.75, 1.0):
        defense = defenses.build("recupfl", zoo=s["zoo"], epsilon=0.0015, iterations=2,
                                 attributes=["ink", "slant"], gamma=[gamma, 1 - gamma])
        defended = torch.stack([gradient_features(defense(DefenseContext(
            s["model"], s["x"][i:i + 1], s["y"][i:i + 1], torch.Generator().manual_seed(i),
            attributes={a: v[i:i + 1] for a, v in s["attrs"].items()})), SIZE)
            for i in s["test"].tolist()])
        for a in asr:
            asr[a].append(s["adversaries"][a].score(defended, s["attrs"][a][s["test"]]))
    print("Stru-NN ASR for gamma_ink 0, 0.25, 0.5, 0.75, 1:",
          {a: [round(v, 3) for v in values] for a, values in asr.items()})
    ink, slant = asr["ink"], asr["slant"]
    assert all(after <= before + 0.03 for before, after in zip(ink, ink[1:])), asr
    assert all(after >= before - 0.03 for before, after in zip(slant, slant[1:])), asr
    assert ink[0] - ink[-1] >= 0.2 and slant[-1] - slant[0] >= 0.08, asr
