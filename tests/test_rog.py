"""ROG (Yue et al., USENIX Security 2023) on digits: it reconstructs undefended uploads, and
against moderate quantization and pruning it recovers more than Inverting Gradients at the
same budget, as the paper reports (paired 95 % interval over the victims)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import lenet_victims, observe_defended

from gradleak import attacks, metrics
from gradleak.attacks.victims import Victims
from gradleak.report.intervals import interval

BUDGET = 100  # ROG's T_max; Inverting Gradients gets as many iterations


def psnr(name: str, victim, defense: str = "none", seed: int = 0, **params) -> float:
    observed = observe_defended(victim, defense, **params_of(defense))
    rec = attacks.build(name, seed=seed, **params)(observed)
    return metrics.psnr(rec.images.clamp(0, 1), victim[1])


def params_of(defense: str) -> dict:
    return {"none": {}, "quantization": {"bits": 4}, "pruning": {"ratio": 0.6}}[defense]


@pytest.fixture(scope="module")
def digit_victims(digits):
    return lenet_victims(digits, 6)


def test_rog_reconstructs_undefended_digits(digit_victims):
    psnrs = [psnr("rog", v, seed=i) for i, v in enumerate(digit_victims[:4])]
    print("ROG PSNR per victim, undefended:", np.round(psnrs, 1).tolist())
    assert np.mean(psnrs) >= 20.0


def test_rog_searches_the_low_resolution_image_and_upsamples_it(digit_victims):
    """The reconstruction is bicubic upsampling of an (H/4) x (W/4) image: the stage's
    variable has that shape and its rendering is the reconstruction."""
    model, x, y = digit_victims[0]
    rog = attacks.build("rog")
    obs = observe_defended(digit_victims[0], "none")
    stage = rog.stage(Victims([obs], restarts=1, seed=0, stacked=False))
    low = stage.draw(obs, torch.Generator().manual_seed(0))[0]
    assert low.shape == (1, 1, 8, 8)
    rendered = stage.images([low[None]])[0]
    assert torch.equal(rendered, F.interpolate(low, size=(32, 32), mode="bicubic",
                                               align_corners=False))
    assert rog(obs).iterations == BUDGET


@pytest.mark.slow
@pytest.mark.parametrize("defense", ["quantization", "pruning"])
def test_rog_beats_inverting_gradients_at_the_same_budget(digit_victims, defense):
    gain = [psnr("rog", v, defense, seed=i)
            - psnr("inverting_gradients", v, defense, seed=i, iterations=BUDGET)
            for i, v in enumerate(digit_victims)]
    low, high = interval(gain)
    print(f"ROG - Inverting Gradients under {defense}, dB per victim:", np.round(gain, 1).tolist(),
          "95 % CI", (round(low, 2), round(high, 2)))
    assert low > 0
