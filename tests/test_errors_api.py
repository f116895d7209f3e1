"""Bad Python API arguments (docs/errors.md, "Python API"): `attacks.build`,
`defenses.build`, `Observation`, `DefenseContext` and the metric functions raise
ValueError or TypeError naming the argument, the value and what was expected, and how to
pass it, before any work, instead of an error from deep inside torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradleak import attacks, defenses, metrics, models
from gradleak.types import Observation


@pytest.fixture(scope="module")
def lenet():
    torch.manual_seed(0)
    model = models.build("lenet", channels=1, num_classes=10, image_size=16)
    x, y = torch.rand(1, 1, 16, 16), torch.tensor([3])
    gradient = defenses.build("none")(defenses.DefenseContext(model=model, x=x, y=y))
    return model, x, y, gradient


@pytest.mark.parametrize("kind, name, kwargs, error, parts", [
    ("attacks", "dlg", {"iterations": 0}, ValueError,
     ["'iterations'", "0", "minimum of 1", "attacks.build('dlg', iterations=300)"]),
    ("attacks", "dlg", {"iterations": -5}, ValueError, ["'iterations'", "-5", "minimum of 1"]),
    ("attacks", "dlg", {"iterations": 2.0}, ValueError, ["'iterations'", "2.0", "integer"]),
    ("attacks", "idlg", {"iterations": "300"}, ValueError, ["'iterations'", "'300'", "integer"]),
    ("attacks", "inverting_gradients", {"restarts": 0}, ValueError,
     ["'restarts'", "0", "minimum of 1", "restarts=1"]),
    ("attacks", "gradinversion", {"restarts": -1}, ValueError, ["'restarts'", "-1"]),
    ("attacks", "dlg", {"iteration": 5}, TypeError,
     ["unknown keyword argument 'iteration'", "did you mean 'iterations'"]),
    ("attacks", "dlg", {"stopper": {"kind": "hybrid", "treshold": 1e-5}}, ValueError,
     ["'stopper.treshold'", "threshold"]),
    ("attacks", "dlg", {"seed": -1}, ValueError, ["seed", "-1", ">= 0", "seed=0"]),
    ("attacks", "dlg", {"seed": "zero"}, TypeError, ["seed", "'zero'", "int"]),
    ("attacks", "gias", {}, ValueError, ["needs generator=", "gradleak train-gan"]),
    ("attacks", "dgl", {}, ValueError, ["unknown attack 'dgl'", "'dlg'"]),
    ("defenses", "dp_gaussian", {"sigma": -1}, ValueError,
     ["'sigma'", "-1", "minimum of 0", "defenses.build('dp_gaussian', sigma=0.01)"]),
    ("defenses", "dp_gaussian", {"sigma": float("nan")}, ValueError, ["'sigma'", "NaN"]),
    ("defenses", "pruning", {"ratio": 1.5}, ValueError, ["'ratio'", "1.5", "maximum of 1"]),
    ("defenses", "dp_gaussian", {"sigm": 0.1}, TypeError, ["'sigm'", "did you mean 'sigma'"]),
    ("defenses", "refiner", {}, ValueError, ["needs evalnet=", "train-evalnet"]),
], ids=["iterations_zero", "iterations_negative", "iterations_float", "iterations_text",
        "restarts_zero", "restarts_negative", "misspelt_keyword", "misspelt_nested_key",
        "seed_negative", "seed_text", "missing_generator", "unknown_attack", "sigma_negative",
        "sigma_nan", "ratio_above_one", "misspelt_defense_keyword", "missing_evalnet"])
def test_build_names_argument_value_and_expectation(kind, name, kwargs, error, parts):
    module = attacks if kind == "attacks" else defenses
    with pytest.raises(error) as raised:
        module.build(name, **kwargs)
    message = str(raised.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


def observe(lenet, **overrides):
    model, _, _, gradient = lenet
    return Observation(**{"model": model, "gradient": gradient, "batch_size": 1, **overrides})


@pytest.mark.parametrize("overrides, error, parts", [
    (lambda g: {"gradient": list(g.values())}, TypeError,
     ["gradient must be a dict parameter name -> torch.Tensor", "got list",
      "model.named_parameters()"]),
    (lambda g: {"gradient": {k: v.numpy() for k, v in g.items()}}, TypeError,
     ["got a dict of ndarray"]),
    (lambda g: {"gradient": {k: v for k, v in g.items() if k != "fc.bias"}}, ValueError,
     ["gradient keys", "fc.bias", "one tensor per model.named_parameters()"]),
    (lambda g: {"gradient": {k: v[..., :1] if v.ndim > 1 else v for k, v in g.items()}},
     ValueError, ["gradient shapes", "(10, 1)", "(10, 192)"]),
    (lambda g: {"batch_size": 0}, ValueError, ["batch_size", ">= 1", "got 0"]),
    (lambda g: {"batch_size": 1.0}, ValueError, ["batch_size", "integer", "1.0"]),
    (lambda g: {"labels": torch.tensor([1, 2])}, ValueError, ["labels", "(1,)", "(2,)"]),
    (lambda g: {"labels": torch.tensor([12])}, ValueError,
     ["labels must be class indices in [0, 10)", "LeNet's 10 outputs", "[12]"]),
    (lambda g: {"labels": torch.tensor([3.0])}, TypeError,
     ["labels must be an integer torch.Tensor", "torch.float32", "labels=None"]),
    (lambda g: {"input_shape": (1, 16)}, ValueError, ["input_shape", "(C, H, W)", "(1, 16)"]),
    (lambda g: {"input_shape": (3, 32, 32)}, ValueError,
     ["input_shape (3, 32, 32)", "LeNet takes (1, 16, 16)", "pass input_shape=(1, 16, 16)"]),
    (lambda g: {"model": "lenet"}, TypeError, ["model must be a torch.nn.Module", "str"]),
], ids=["gradient_list", "gradient_numpy", "gradient_missing_key", "gradient_wrong_shape",
        "batch_zero", "batch_float", "labels_shape", "labels_beyond_the_classes",
        "labels_float", "input_shape_2d", "input_shape_channels",
        "model_not_a_module"])
def test_observation_names_argument_value_and_expectation(lenet, overrides, error, parts):
    with pytest.raises(error) as raised:
        observe(lenet, **overrides(lenet[3]))
    for part in parts:
        assert part in str(raised.value), str(raised.value)


def test_observation_needs_input_shape_where_the_model_has_none():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 10))
    gradient = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=r"needs input_shape=\(C, H, W\): Sequential has no"):
        Observation(model=model, gradient=gradient, batch_size=1)
    assert Observation(model=model, gradient=gradient, batch_size=1,
                       input_shape=(1, 4, 4)).input_shape == (1, 4, 4)


@pytest.mark.parametrize("call, error, parts", [
    (lambda: metrics.psnr(torch.rand(1, 1, 16, 16), torch.rand(1, 1, 8, 8)), ValueError,
     ["(B, C, H, W)", "(1, 1, 16, 16)", "(1, 1, 8, 8)"]),
    (lambda: metrics.ssim(torch.rand(1, 16, 16), torch.rand(1, 16, 16)), ValueError,
     ["(B, C, H, W)", "(1, 16, 16)"]),
    (lambda: metrics.mse(np.zeros((1, 1, 4, 4)), torch.rand(1, 1, 4, 4)), TypeError,
     ["rec must be a torch.Tensor", "ndarray", "torch.as_tensor(rec)"]),
    (lambda: metrics.psnr(torch.rand(1, 1, 4, 4), [[0.5]]), TypeError,
     ["truth must be a torch.Tensor", "list"]),
    (lambda: metrics.psnr(torch.rand(1, 1, 4, 4), torch.rand(1, 1, 4, 4), reduction="sum"),
     ValueError, ["reduction", "'mean' or 'none'", "'sum'"]),
    (lambda: metrics.noise_ratio(torch.rand(1, 1, 16, 16), None), TypeError,
     ["evalnet must be the trained evaluation network", "NoneType"]),
], ids=["shape_mismatch", "three_dimensions", "numpy_rec", "list_truth", "reduction",
        "noise_ratio_without_evalnet"])
def test_metrics_name_argument_value_and_expectation(call, error, parts):
    with pytest.raises(error) as raised:
        call()
    for part in parts:
        assert part in str(raised.value), str(raised.value)


@pytest.mark.parametrize("x, y, parts", [
    (torch.rand(1, 3, 16, 16), torch.tensor([3]), ["x has 3 channels", "(1, 16, 16)"]),
    (torch.rand(16, 16), torch.tensor([3]), ["x must be a (B, C, H, W) torch.Tensor",
                                             "(16, 16)"]),
    (torch.rand(2, 1, 16, 16), torch.tensor([3]), ["y must be a torch.Tensor of 2 labels",
                                                   "(1,)"]),
], ids=["channels", "no_batch_dimension", "labels_count"])
def test_defense_context_names_argument_value_and_expectation(lenet, x, y, parts):
    with pytest.raises(ValueError) as raised:
        defenses.DefenseContext(model=lenet[0], x=x, y=y)
    for part in parts:
        assert part in str(raised.value), str(raised.value)


def test_good_arguments_still_run(lenet):
    """The checks reject only what is wrong: the README's example goes through."""
    model, x, _, gradient = lenet
    rec = attacks.build("dlg", iterations=2, seed=0)(observe(lenet))
    assert rec.images.shape == x.shape
    assert np.isfinite(metrics.psnr(rec.images, x))
    assert set(defenses.build("dp_gaussian", sigma=0.001)(
        defenses.DefenseContext(model=model, x=x, y=torch.tensor([3])))) == set(gradient)
