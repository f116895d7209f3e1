"""Shared types: a Setting has one canonical text that reads back exactly; an Update knows
its model's keys and shapes."""

import math

import pytest
import torch

from gradleak.models import LeNet
from gradleak.settings import Setting
from gradleak.types import Observation, Update


@pytest.mark.parametrize("setting, text", [
    (Setting.of("none", 0), "none-0"),
    (Setting.of("dp_gaussian", 1e-5), "dp_gaussian-1e-05"),
    (Setting.of("quantization", 8.0), "quantization-8"),
    (Setting.of("refiner", 0.1, {"beta": 0.5}), "refiner-0.1~beta=0.5"),
    (Setting.of("refiner", 0.1, {"iterations": 5, "beta": 2.0}),
     "refiner-0.1~beta=2.0~iterations=5"),
    (Setting.of("none", 0, {"attacks.gias.variant": "z/w", "attack.protocol.round": 3}),
     "none-0~attack.protocol.round=3~attacks.gias.variant=z%2Fw"),
    (Setting.of("pruning", 0.9, {"mode": "weight_grad", "flag": True, "steps": [30, 15]}),
     "pruning-0.9~flag=true~mode=weight_grad~steps=[30,15]"),
])
def test_setting_text_is_canonical_and_reads_back_exactly(setting, text):
    assert setting.text == text
    assert Setting.parse(text) == setting
    assert hash(Setting.parse(text)) == hash(setting)


def test_close_strengths_stay_distinct_settings():
    a, b = Setting.of("dp_gaussian", 0.1), Setting.of("dp_gaussian", 0.1 + 1e-12)
    assert a.text != b.text and Setting.parse(b.text).strength == b.strength
    assert Setting.of("x", 0, {"v": 1}) != Setting.of("x", 0, {"v": 1.0})  # int vs float
    assert Setting.parse("x-0~v=1").overrides == (("v", 1),)
    assert Setting.parse("x-0~v=1.0").overrides == (("v", 1.0),)


def test_a_string_that_looks_like_a_number_stays_a_string():
    setting = Setting.of("censor", 5, {"proposal": "5", "other": "true"})
    assert Setting.parse(setting.text) == setting


@pytest.mark.parametrize("text", ["dp_gaussian", "dp_gaussian-x", "Dp-1", "refiner-0.10",
                                  "refiner-0.1~beta", "refiner-0.1~beta=1~alpha=2"])
def test_bad_or_non_canonical_text_is_refused(text):
    with pytest.raises(ValueError, match="setting"):
        Setting.parse(text)


def test_label_and_parts():
    s = Setting.of("refiner", 0.1, {"beta": 0.5, "attack.protocol.round": 2})
    assert s.label == "refiner~attack.protocol.round=2~beta=0.5"
    assert s.defense_params == {"beta": 0.5}
    assert s.config_overrides == {"attack.protocol.round": 2}
    assert s.without(("attack.",)) == Setting.of("refiner", 0.1, {"beta": 0.5})
    with pytest.raises(ValueError, match="finite"):
        Setting.of("x", math.nan)


def test_update_is_the_model_gradient_and_checks_shapes():
    torch.manual_seed(0)
    model = LeNet(1, 10, 16)
    x, y = torch.rand(2, 1, 16, 16), torch.tensor([1, 2])
    update = Update.of(model, x, y)
    assert list(update) == [n for n, _ in model.named_parameters()]
    assert float(update.norm()) > 0
    update.check(model)
    bad = Update(update)
    bad["fc.bias"] = torch.zeros(3)
    with pytest.raises(ValueError, match="shapes"):
        Observation(model=model, gradient=bad, batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        Observation(model=model, gradient=update, batch_size=0)
    with pytest.raises(ValueError, match="input_shape"):
        Observation(model=torch.nn.Linear(3, 2), gradient=Update.of(
            torch.nn.Linear(3, 2), torch.rand(1, 3), torch.tensor([0])), batch_size=1)
