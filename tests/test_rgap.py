"""R-GAP (Zhu and Blaschko, ICLR 2021) on its CNN6/CNN10 and DLG's LeNet: the closed-form
recursion recovers one digit from its undefended gradient, reports every layer's rank
analysis and residual, refuses models outside its standard form and fails under noise
(GIAS App. C, Fig. A2: the error grows toward the input); with a generative prior (GIAS
Eq. 11, Fig. A1) the lowest layers are solved through the generator, and the attack phase
records every layer's error."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradleak import attacks, defenses, metrics, models
from gradleak.attacks.rgap import layer_errors


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


class InRange(nn.Module):
    """A generator that can represent ``truth`` exactly: G(z) = tanh(atanh(2 x - 1) + B z),
    the truth at z = 0 (``to_model_input`` maps it back to x)."""

    def __init__(self, truth: torch.Tensor, latent_dim: int = 16) -> None:
        super().__init__()
        self.latent_dim = latent_dim
        self.register_buffer("base", torch.atanh(2 * truth - 1))
        self.register_buffer("basis", 0.3 * torch.randn(latent_dim, *truth.shape[1:],
                                                        generator=torch.Generator().manual_seed(0)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.base + torch.einsum("bd,dchw->bchw", z, self.basis))


def in_range_digit(digits, size: int = 16):
    """A digit inside tanh's open range (pixels 0.01 .. 0.99), so that InRange reaches it."""
    x, y = digit(digits, size)
    return 0.01 + 0.98 * x, y


@pytest.mark.slow
def test_the_prior_solves_the_lowest_layers_through_the_generator(digits):
    """GIAS Eq. 11, prior_layers k counted from the input: the convolutions above k are the
    closed form's (the same errors, ~1e-7), convolution k's input is f_k(G(z*)) and every
    layer below is G(z*)'s. A generator that can represent the digit brings the prior layers
    to ~1e-2 (measured 0.009 at k = 1, 0.013 at k = 2, 200 steps); DCGAN's untrained weights
    cannot (0.86)."""
    x, y = in_range_digit(digits)
    model = seeded("cnn6", 16)
    obs = observe(model, x, y)
    plain = layer_errors(model, x, attacks.build("rgap")(obs).extra["inputs"])
    small = {"latent_iterations": 200, "latent_restarts": 2}
    for k, bound in ((1, 0.03), (2, 0.05)):
        rec = attacks.build("rgap", prior_layers=k, generator=InRange(x), **small)(obs)
        errors = layer_errors(model, x, rec.extra["inputs"])
        print(f"prior_layers {k}: per-layer errors (input first)", [f"{e:.2g}" for e in errors])
        assert max(errors[:k]) < bound and errors[k:] == pytest.approx(plain[k:], rel=1e-6)
        assert [layer["solved"] for layer in rec.extra["layers"]] == [
            *["G(z*)"] * (k - 1), "latent search", *["pseudo-inverse"] * (6 - k), "head"]
        inputs = rec.extra["inputs"]
        assert torch.equal(rec.images[0], inputs[0])  # the image is G(z*), in [0, 1]
        if k == 2:  # the searched layer's input is f_2(G(z*)): conv 1 and LeakyReLU of it
            below = F.leaky_relu(model.body[0](rec.images), 0.2).detach()
            assert torch.allclose(inputs[1].reshape(below.shape), below, atol=1e-6)
        assert rec.stop_reason == "closed_form+latent_search"
        assert rec.extra["layers"][k - 1]["rank"] == rec.extra["layers"][k - 1]["unknowns"]
        assert rec.iterations == len(rec.loss_trace) == (7 - k) + 201  # layers, steps, final
    untrained = models.dcgan.untrained_generator(16, 1, 8, 0)
    again = [attacks.build("rgap", prior_layers=1, generator=untrained, **small)(obs)
             for _ in range(2)]
    assert layer_errors(model, x, again[0].extra["inputs"])[0] > 0.5
    assert torch.equal(again[0].images, again[1].images)  # seeded: deterministic


def test_prior_layers_beyond_the_convolutions_are_refused_before_any_work(digits):
    class Untouchable(nn.Module):
        latent_dim = 4

        def forward(self, z):
            raise AssertionError("the generator ran")

    x, y = in_range_digit(digits)
    obs = observe(seeded("cnn6", 16), x, y)
    with pytest.raises(ValueError, match=r"prior_layers 7 exceeds the 6 convolution layers "
                                         r"of CNN; expected 0 \.\. 6"):
        attacks.build("rgap", prior_layers=7, generator=Untouchable())(obs)
    with pytest.raises(ValueError, match="needs generator="):
        attacks.build("rgap", prior_layers=1)
    from gradleak import config

    def needs(**params):
        return attacks.needs("rgap", config.resolve("attacks", "rgap", params))

    assert needs() == {} and needs(prior_layers=2) == {"generator": "gan"}
    assert needs(prior_layers=1, prior_dataset="cifar10") == {"generator": "gan:cifar10"}


def test_the_attack_phase_records_every_layers_error(digits, tmp_path):
    """metrics.json's victim record holds layer_errors (input first) and the layer reports
    of an attack whose reconstruction carries per-layer inputs, and the target frame reads
    them; other attacks' records have none."""
    from gradleak.experiment.records import victim_record as _victim_record
    from gradleak.report.tables import ATTACK_KEYS, victim_rows
    from gradleak.utils.io import write_json

    x, y = in_range_digit(digits)
    model = seeded("cnn6", 16)
    obs = observe(model, x, y)
    truth = (torch.tensor([0]), x, y)
    rec = attacks.build("rgap", prior_layers=1, generator=InRange(x), latent_iterations=50,
                        latent_restarts=1)(obs)
    record, _ = _victim_record(0, truth, obs, rec, ["psnr"], None, "paper")
    assert record["layer_errors"] == layer_errors(model, x, rec.extra["inputs"])
    assert len(record["layer_errors"]) == 7 and all(map(math.isfinite, record["layer_errors"]))
    assert [layer["solved"] for layer in record["layers"]][:2] == ["latent search",
                                                                   "pseudo-inverse"]
    other = attacks.Reconstruction(x, y, [1.0], 1, 0.0, "max_iterations")
    assert "layer_errors" not in _victim_record(0, truth, obs, other, ["psnr"], None, "paper")[0]
    path = tmp_path / "metrics.json"
    write_json(path, {**{k: 0 for k in ATTACK_KEYS}, "runs": {
        "rgap": {"victims": [record]},
        "dlg": {"victims": [_victim_record(0, truth, obs, other, ["psnr"], None, "paper")[0]]}}})
    rows = {row["attack"]: row for row in victim_rows(path)}
    assert rows["rgap"]["layer_errors"] == record["layer_errors"]
    assert "layer_errors" not in rows["dlg"]


def test_the_latent_searchs_cost_is_the_closed_forms_system():
    """Eq. 11's differentiable cost |A_r x - b_r|^2 / |b_r|^2 (patches and a convolution)
    equals the sparse system the pseudo-inverse solves (padding and strides included)."""
    from gradleak.attacks.rgap_system import layer_system, system_cost

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 4, stride=2, padding=2, bias=False).double()
    weight = conv.weight.detach()
    x = torch.rand(2, 3, 9, 9, dtype=torch.float64)
    out_shape = conv(x[:1]).shape[1:]
    k, z = torch.randn(out_shape, dtype=torch.float64), torch.randn(out_shape, dtype=torch.float64)
    grad = torch.randn_like(weight)
    a, b, _ = layer_system(conv, weight, grad, None, k, z, (3, 9, 9))
    expected = [np.square(a @ xi.flatten().numpy() - b).sum() / np.square(b).sum() for xi in x]
    cost = system_cost(conv, weight, grad, None, k, z, device="cpu", dtype=torch.float64)(x)
    assert cost.tolist() == pytest.approx(expected, rel=1e-10)


def test_the_latent_search_is_the_engines_stage(digits, monkeypatch):
    """Eq. 11's search runs through the engine's loop like every attack's stage: one
    ``Victims.solve`` of a Stage whose cost is the system's (no gradient distance), GIAS's
    schedule (App. H), the restarts drawn from the attack's seed."""
    from gradleak.attacks import victims
    from gradleak.attacks.gias import MILESTONES

    seen, solve = [], victims.Victims.solve
    monkeypatch.setattr(victims.Victims, "solve", lambda self, stage, starts=None: (
        seen.append((stage, self.restarts, self.seed)) or solve(self, stage, starts)))
    x, y = in_range_digit(digits)
    obs = observe(seeded("cnn6", 16), x, y)
    rec = attacks.build("rgap", prior_layers=1, generator=InRange(x), latent_iterations=20,
                        latent_restarts=3, seed=5)(obs)
    [(stage, restarts, seed)] = seen
    assert stage.distance is None and stage.cost is not None and stage.lr == 3e-2
    assert (stage.iterations, tuple(stage.milestones), restarts, seed) == (20, MILESTONES, 3, 5)
    assert 0 <= rec.restart < 3 and len(rec.loss_trace) == 6 + 21


@pytest.mark.parametrize("spread", [1.0, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 0.0])
def test_the_rank_after_a_condition_estimate_is_the_eigenvalues_count(spread, monkeypatch):
    """A Gram matrix whose smallest singular values are ``spread`` x the largest (0: rank
    n - 5): the rank :func:`rgap_system.numerical_rank` reports, first from LAPACK's
    condition estimate where a Cholesky factor exists, is the count of singular values
    above the cutoff, as the full spectrum gives; a spectrum clear of the cutoff needs no
    eigendecomposition."""
    from gradleak.attacks.rgap_system import numerical_rank

    n, rcond = 300, 1e-7
    rng = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=rng))[0]
    singular = torch.logspace(0, -3, n, dtype=torch.float64)
    singular[-5:] = spread
    gram = (basis * singular**2) @ basis.T
    gram = (gram + gram.T) / 2
    factor, failed = torch.linalg.cholesky_ex(gram)
    expected = torch.linalg.eigvalsh(gram).clamp(min=0).sqrt()
    assert numerical_rank(gram, None if failed else factor, rcond) == \
        int((expected > rcond * expected[-1]).sum())
    if spread >= 1e-4:
        monkeypatch.setattr(torch.linalg, "eigvalsh", None)
        assert numerical_rank(gram, factor, rcond) == n



def test_a_layer_system_solved_before_is_not_built_again(digits, monkeypatch):
    """R-GAP's rows with and without a prior attack one upload with the same systems above
    the prior (GIAS Table 1): each is solved once, with the images and reports of solving
    it again; another upload's systems are its own."""
    from gradleak.attacks import rgap_system

    model = seeded("cnn6", 16)
    first, second = (observe(model, *digit(digits, 16, index)) for index in (0, 1))
    built, gram = [], rgap_system.normal_equations
    monkeypatch.setattr(rgap_system, "normal_equations",
                        lambda *args: built.append(1) or gram(*args))
    monkeypatch.setattr(rgap_system, "SOLVED", type(rgap_system.SOLVED)())
    fresh = attacks.build("rgap")(first)
    layers = len(built)
    again = attacks.build("rgap")(first)
    assert len(built) == layers == 6
    assert torch.equal(again.images, fresh.images)
    assert again.extra["layers"] == fresh.extra["layers"]
    assert all(map(torch.equal, again.extra["inputs"], fresh.extra["inputs"]))
    attacks.build("rgap")(second)
    assert len(built) == 2 * layers
    monkeypatch.setattr(rgap_system, "SOLVED", type(rgap_system.SOLVED)())
    assert torch.equal(attacks.build("rgap")(first).images, fresh.images)
