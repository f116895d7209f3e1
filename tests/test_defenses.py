import pytest
import torch

from fedleak import defenses
from fedleak.models import LeNet


@pytest.fixture()
def context(digits):
    torch.manual_seed(0)
    model = LeNet(1, 10, 32)
    return lambda seed=0: defenses.DefenseContext(
        model=model, x=digits.x[:8], y=digits.y[:8],
        generator=torch.Generator().manual_seed(seed))


def test_registry_lists_the_baselines():
    assert defenses.available() == ["dp_gaussian", "dp_laplace", "none", "pruning",
                                    "quantization"]
    with pytest.raises(ValueError, match="unknown defense 'dp_gausian'"):
        defenses.build("dp_gausian")


@pytest.mark.parametrize("name, params", [
    ("dp_gaussian", {"sigma": -1.0}), ("dp_laplace", {"scale": -0.5}),
    ("quantization", {"bits": 0}), ("pruning", {"ratio": 1.5}),
])
def test_bad_strength_is_rejected_with_its_name(name, params):
    key = next(iter(params))
    with pytest.raises(ValueError, match=key):
        defenses.build(name, **params)


@pytest.mark.parametrize("name", ["none", "dp_gaussian", "dp_laplace", "quantization", "pruning"])
def test_update_has_the_model_parameter_keys_and_shapes(context, name):
    ctx = context()
    update = defenses.build(name)(ctx)
    shapes = {n: p.shape for n, p in ctx.model.named_parameters()}
    assert {n: u.shape for n, u in update.items()} == shapes


def test_none_uploads_the_true_gradient(context):
    ctx = context()
    update = defenses.build("none")(ctx)
    assert all(torch.equal(update[k], v) for k, v in ctx.true_gradient().items())


def test_gaussian_noise_has_the_requested_scale_and_is_seeded(context):
    clean = defenses.build("dp_gaussian", sigma=0.0, clip=None)(context())
    noisy = defenses.build("dp_gaussian", sigma=0.5, clip=None)(context())
    again = defenses.build("dp_gaussian", sigma=0.5, clip=None)(context())
    residual = torch.cat([(noisy[k] - clean[k]).flatten() for k in clean])
    assert abs(float(residual.std()) - 0.5) < 0.02
    assert all(torch.equal(noisy[k], again[k]) for k in noisy)


def test_clipping_bounds_the_global_norm(context):
    update = defenses.build("dp_gaussian", sigma=0.0, clip=1.0)(context())
    norm = torch.sqrt(sum((u ** 2).sum() for u in update.values()))
    assert float(norm) == pytest.approx(1.0, rel=1e-5)


def test_laplace_noise_has_the_requested_scale(context):
    clean = defenses.build("dp_laplace", scale=0.0, clip=None)(context())
    noisy = defenses.build("dp_laplace", scale=0.2, clip=None)(context())
    residual = torch.cat([(noisy[k] - clean[k]).flatten() for k in clean])
    assert abs(float(residual.abs().mean()) - 0.2) < 0.01  # E|Laplace(0, b)| = b


def test_pruning_zeroes_the_smallest_fraction_per_layer(context):
    ctx = context()
    update = defenses.build("pruning", ratio=0.75)(ctx)
    for name, grad in ctx.true_gradient().items():
        pruned = update[name]
        assert int((pruned == 0).sum()) >= int(0.75 * grad.numel())
        kept = pruned != 0
        if kept.any() and (~kept).any():
            assert grad[kept].abs().min() >= grad[~kept].abs().max()


def test_quantization_is_unbiased_and_coarse(context):
    true = context().true_gradient()["fc.weight"]
    draws = torch.stack([defenses.build("quantization", bits=2)(context(seed))["fc.weight"]
                         for seed in range(400)])
    assert draws[0].unique().numel() <= 2 * (2**2 - 1) + 1
    assert float((draws.mean(0) - true).abs().max()) < 0.1 * float(true.norm())
