"""R-GAP (Zhu and Blaschko, ICLR 2021) on its CNN6/CNN10 and DLG's LeNet: the closed-form
recursion recovers one digit from its undefended gradient, reports every layer's rank
analysis and residual, refuses models outside its standard form and fails under noise
(GIAS App. C, Fig. A2: the error grows toward the input)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedleak import attacks, defenses, metrics, models
from fedleak.attacks.rgap import layer_errors


def observe(model, x, y, defense: str = "none", **params) -> attacks.Observation:
    """One client's (defended) gradient of one image, labels not given to the attacker."""
    ctx = defenses.DefenseContext(model=model, x=x, y=y, rng=torch.Generator().manual_seed(0))
    return attacks.Observation(model=model, gradient=defenses.build(defense, **params)(ctx),
                               batch_size=len(x))


def seeded(name: str, size: int, seed: int = 0, **options) -> nn.Module:
    torch.manual_seed(seed)
    return models.build(name, 1, 10, size, **options)


def digit(digits, size: int, index: int = 0):
    x = digits.x[index:index + 1]
    return (x if size == x.shape[-1] else F.interpolate(x, size=size, mode="area")), \
        digits.y[index:index + 1]


def test_cnn6_and_cnn10_are_r_gaps_bias_free_leakyrelu_networks():
    for name, convs in (("cnn6", 6), ("cnn10", 10)):
        model = models.build(name, 3, 10, 32)
        layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        assert len(layers) == convs + 1 and all(m.bias is None for m in layers)
        assert layers[-1].in_features == 3200 and model(torch.zeros(1, 3, 32, 32)).shape == (1, 10)


def test_rgap_recovers_a_digit_from_an_undefended_cnn6_gradient(digits):
    """The issue's check: CNN6 (random weights, 1x32x32), one digit, undefended: >= 30 dB;
    the label inferred from the bias-free head; every layer determined (rank = unknowns)."""
    x, y = digit(digits, 32)
    model = seeded("cnn6", 32)
    rec = attacks.build("rgap")(observe(model, x, y))
    psnr = metrics.psnr(rec.images, x)
    errors = layer_errors(model, x, rec.extra["inputs"])
    print(f"CNN6 32x32: PSNR {psnr:.1f} dB in {rec.wall_time:.1f} s; per layer (input first):")
    for layer, error in zip(rec.extra["layers"], errors):
        print(f"  {layer}  error {error:.2g}")
    assert psnr >= 30 and torch.equal(rec.labels, y)
    assert [layer["rank"] for layer in rec.extra["layers"]] == [
        layer["unknowns"] for layer in rec.extra["layers"]]
    assert max(errors) < 1e-3 and rec.stop_reason == "closed_form" and rec.iterations == 7


def test_per_layer_errors_grow_toward_the_input_on_cnn10(digits):
    """Exact gradient: every layer recovered (errors ~1e-6, float32 gradients); a little
    noise (sigma 1e-6): the error grows from the last layer to the input (Fig. A2)."""
    x, y = digit(digits, 16)
    model = seeded("cnn10", 16)
    exact = attacks.build("rgap")(observe(model, x, y))
    noisy = attacks.build("rgap")(observe(model, x, y, "dp_gaussian", sigma=1e-6))
    clean_errors = layer_errors(model, x, exact.extra["inputs"])
    errors = layer_errors(model, x, noisy.extra["inputs"])
    print("CNN10 16x16 per-layer errors (input first), exact:",
          [f"{e:.1g}" for e in clean_errors], "sigma 1e-6:", [f"{e:.2g}" for e in errors])
    assert len(errors) == 11 and all(math.isfinite(e) for e in errors + clean_errors)
    assert max(clean_errors) < 1e-4
    assert errors[0] > 5 * errors[-1] and errors[1] > errors[-2]
    assert all(math.isfinite(layer["residual"]) for layer in noisy.extra["layers"])


def test_a_defense_lowers_rgaps_psnr_and_the_attack_is_deterministic(digits):
    x, y = digit(digits, 16)
    model = seeded("cnn6", 16)
    clean = attacks.build("rgap")(observe(model, x, y))
    again = attacks.build("rgap")(observe(model, x, y))
    noisy = attacks.build("rgap")(observe(model, x, y, "dp_gaussian", sigma=1e-4))
    before, after = metrics.psnr(clean.images, x), metrics.psnr(noisy.images, x)
    print(f"CNN6 16x16: {before:.1f} dB undefended, {after:.1f} dB under dp_gaussian 1e-4")
    assert torch.equal(clean.images, again.images)
    assert before >= 30 and after < before - 10


def test_lenet_with_biases_and_sigmoids_is_in_standard_form(digits):
    """DLG's LeNet (bias, Sigmoid, strides, no pooling): the bias gradient gives dL/dz."""
    x, y = digit(digits, 16)
    rec = attacks.build("rgap")(observe(seeded("lenet", 16), x, y))
    assert metrics.psnr(rec.images, x) >= 30 and torch.equal(rec.labels, y)


def test_models_outside_the_standard_form_are_refused_by_name(digits):
    x, y = digit(digits, 32)
    rgap = attacks.build("rgap")
    with pytest.raises(ValueError, match=r"standard form.*ResNet has .*BatchNorm2d"):
        rgap(observe(seeded("resnet18", 32), x, y))
    pooled = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.LeakyReLU(0.2), nn.MaxPool2d(2),
                           nn.Flatten(), nn.Linear(4 * 15 * 15, 10))
    pooled.input_shape = (1, 32, 32)
    with pytest.raises(ValueError, match="Sequential has 2: MaxPool2d"):
        rgap(observe(pooled, x, y))
    xs, ys = digits.x[:2], digits.y[:2]
    with pytest.raises(ValueError, match="batch_size 2 for CNN"):
        rgap(observe(seeded("cnn6", 32), xs, ys))
