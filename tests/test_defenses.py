import pytest
import torch

from gradleak import defenses
from gradleak.defenses.soteria import defended_layer
from gradleak.models import LeNet


@pytest.fixture()
def context(digits):
    torch.manual_seed(0)
    model = LeNet(1, 10, 32)
    return lambda seed=0: defenses.DefenseContext(
        model=model, x=digits.x[:8], y=digits.y[:8],
        generator=torch.Generator().manual_seed(seed))


def test_registry_lists_the_defenses():
    assert defenses.available() == ["censor", "clipping", "dp_gaussian", "dp_laplace",
                                    "layer_noise", "none", "pruning", "quantization", "recupfl",
                                    "refiner", "soteria"]
    with pytest.raises(ValueError, match="unknown defense 'dp_gausian'"):
        defenses.build("dp_gausian")


@pytest.mark.parametrize("name, params", [
    ("dp_gaussian", {"sigma": -1.0}), ("dp_laplace", {"scale": -0.5}),
    ("quantization", {"bits": 0}), ("pruning", {"ratio": 1.5}), ("clipping", {"bound": 0}),
    ("soteria", {"ratio": -0.1}), ("censor", {"trials": 0}),
])
def test_bad_strength_is_rejected_with_its_name(name, params):
    key = next(iter(params))
    with pytest.raises(ValueError, match=key):
        defenses.build(name, **params)


@pytest.mark.parametrize("name", ["none", "dp_gaussian", "dp_laplace", "quantization", "pruning",
                                  "clipping", "soteria", "censor"])
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


@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.9, 0.99, 1.0])
def test_pruning_by_selection_is_a_stable_sorts_first_count(ratio):
    """Ties broken by index, as a stable sort of the scores takes its first entries."""
    from gradleak.defenses.pruning import prune_smallest

    gen = torch.Generator().manual_seed(0)
    for score in (torch.randint(0, 5, (1000,), generator=gen).float(),
                  torch.rand(1000, generator=gen)):
        values = torch.randn(1000, generator=gen)
        kept = torch.ones(1000)
        kept[torch.argsort(score, stable=True)[:int(ratio * 1000)]] = 0
        assert torch.equal(prune_smallest(score, values, ratio), values * kept)


def test_quantization_is_unbiased_and_coarse(context):
    true = context().true_gradient()["fc.weight"]
    draws = torch.stack([defenses.build("quantization", bits=2)(context(seed))["fc.weight"]
                         for seed in range(400)])
    assert draws[0].unique().numel() <= 2 * (2**2 - 1) + 1
    assert float((draws.mean(0) - true).abs().max()) < 0.1 * float(true.norm())


def test_quantization_s_nearest_reading_rounds_to_the_nearest_level_straight_through(context):
    """The other reading of Refiner's GQ: |v_i| s / ||v|| rounded to the nearest level, the
    same with every seed; its adaptive trial is that rounding, with the identity's gradient."""
    nearest = defenses.build("quantization", bits=1, rounding="nearest")
    upload = nearest(context(0))
    assert all(torch.equal(upload[k], v) for k, v in nearest(context(1)).items())
    true = context().true_gradient()["fc.weight"]
    level = float(true.norm())
    expected = torch.where(true.abs() / level >= 0.5, true.sign() * level, torch.zeros(()))
    assert torch.allclose(upload["fc.weight"], expected)
    trial = defenses.Update({"w": torch.tensor([3.0, -4.0, 0.1], requires_grad=True)})
    matched = nearest.adaptive(trial, context(), upload)["w"]
    assert torch.allclose(matched.detach(), 5.001 * torch.tensor([1.0, -1.0, 0.0]), atol=1e-3)
    matched.sum().backward()
    assert torch.equal(trial["w"].grad, torch.ones(3))


def test_clipping_bounds_every_layer(context):
    ctx = context()
    update = defenses.build("clipping", bound=0.05)(ctx)
    for name, grad in ctx.true_gradient().items():
        norm = float(update[name].norm())
        assert norm <= 0.05 + 1e-6
        torch.testing.assert_close(update[name] / norm, grad / grad.norm())


@pytest.mark.parametrize("mode", ["grad", "weight", "weight_grad"])
def test_pruning_modes_rank_by_their_score(context, mode):
    ctx = context()
    update = defenses.build("pruning", ratio=0.5, mode=mode)(ctx)
    weight = dict(ctx.model.named_parameters())["fc.weight"].detach()
    grad = ctx.true_gradient()["fc.weight"]
    score = {"grad": grad.abs(), "weight": weight.abs(), "weight_grad": (grad * weight).abs()}[mode]
    kept = update["fc.weight"] != 0
    assert score[kept].min() >= score[~kept].max()


@pytest.mark.slow
@pytest.mark.parametrize("channels", [1, 3])  # forward-mode and reverse-mode Jacobians
def test_soteria_vectorised_mask_equals_the_per_feature_loop(digits, channels):
    from gradleak.defenses.soteria import feature_scores, feature_scores_loop, soteria_mask

    torch.manual_seed(0)
    model, x = LeNet(channels, 10, 32), digits.x[:8].expand(-1, channels, -1, -1)
    fast, slow = feature_scores(model, x), feature_scores_loop(model, x)
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-6)
    assert torch.equal(soteria_mask(fast, 0.3), soteria_mask(slow, 0.3))
    chunked = feature_scores(model, x, feature_chunk=100)  # 768 features: 8 passes a sample
    torch.testing.assert_close(chunked, fast, rtol=1e-5, atol=1e-7)
    assert torch.equal(soteria_mask(chunked, 0.3), soteria_mask(fast, 0.3))


def test_soteria_in_feature_chunks_keeps_the_mask_on_a_resnet():
    """A ResNet with BatchNorm (the Table 5 models): chunks of features give the vectorised
    pass's upload, in bounded memory."""
    from gradleak.models import build

    torch.manual_seed(0)
    model = build("resnet10", channels=3, num_classes=10, image_size=16)
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    ctx = defenses.DefenseContext(model=model, x=x, y=torch.tensor([1, 2]))
    whole = defenses.build("soteria", ratio=0.3)(ctx)
    chunked = defenses.build("soteria", ratio=0.3, feature_chunk=64)(ctx)
    key = defended_layer(model)
    assert torch.equal(whole[key] == 0, chunked[key] == 0)
    torch.testing.assert_close(chunked[key], whole[key])


def test_soteria_zeroes_fc_columns_only(context):
    ctx = context()
    update = defenses.build("soteria", ratio=0.4)(ctx)
    zero_columns = (update["fc.weight"] == 0).all(0)
    assert int(zero_columns.sum()) == int(0.4 * 768)
    for name, grad in ctx.true_gradient().items():
        if name != "fc.weight":
            assert torch.equal(update[name], grad)


@pytest.mark.parametrize("proposal", ["normal", "public"])
def test_censor_upload_is_orthogonal_with_the_true_norm_per_layer(context, digits, proposal):
    ctx = context()
    public = (digits.x[100:200], digits.y[100:200])  # §V-E: gradients of other labelled images
    update = defenses.build("censor", trials=20, proposal=proposal, public=public)(ctx)
    for name, grad in ctx.true_gradient().items():
        cos = torch.nn.functional.cosine_similarity(update[name].flatten(), grad.flatten(), dim=0)
        assert abs(float(cos)) < 1e-4
        assert float(update[name].norm()) == pytest.approx(float(grad.norm()), rel=1e-5)


def test_censor_uploads_the_lowest_loss_trial(context):
    from torch.func import functional_call

    from gradleak.defenses.censor import orthogonalise

    ctx = context(seed=5)
    upload = defenses.build("censor", trials=20)(ctx)
    params = {n: p.detach() for n, p in ctx.model.named_parameters()}
    replay = torch.Generator().manual_seed(5)
    losses, candidates = [], []
    with torch.no_grad():
        for _ in range(20):
            cand = {k: orthogonalise(torch.randn(g.shape, generator=replay), g)
                    for k, g in ctx.true_gradient().items()}
            stepped = {k: params[k] - 1e-4 * cand[k] for k in params}
            losses.append(float(torch.nn.functional.cross_entropy(
                functional_call(ctx.model, stepped, (ctx.x,)), ctx.y)))
            candidates.append(cand)
    best = candidates[min(range(20), key=losses.__getitem__)]
    assert all(torch.equal(upload[k], best[k]) for k in best)


def test_censor_public_proposal_needs_public_images_and_is_a_known_proposal():
    with pytest.raises(ValueError, match="public"):
        defenses.build("censor", proposal="public")
    with pytest.raises(ValueError, match="'gumbel'"):
        defenses.build("censor", proposal="gumbel")


def test_censor_public_proposal_follows_the_public_gradient_off_the_true_one(context, digits):
    """The §V-E upload keeps most of a public batch's gradient direction; a normal one none."""
    from gradleak.types import Update

    ctx = context(seed=3)
    public = (digits.x[100:108], digits.y[100:108])
    upload = defenses.build("censor", trials=1, proposal="public", public=public)(ctx)
    random = defenses.build("censor", trials=1)(ctx)
    reference = Update.of(ctx.model, *public)  # 8 of 8 public images: the only possible batch
    cos = lambda u: float(torch.nn.functional.cosine_similarity(  # noqa: E731
        u["fc.weight"].flatten(), reference["fc.weight"].flatten(), dim=0))
    print(f"cos to the public gradient: public {cos(upload):.3f}, normal {cos(random):.3f}")
    assert cos(upload) > 0.3 and abs(cos(random)) < 0.05


def test_censor_algorithm1_falls_back_to_the_clean_gradient_when_no_trial_beats_it(context):
    """Alg. 1 as printed: the incumbent is the clean gradient at the loss of theta; with a
    step so large that every trial raises the loss, the clean gradient is uploaded."""
    ctx = context()
    upload = defenses.build("censor", variant="algorithm1", trials=5, step=100.0)(ctx)
    assert upload.info["fallback"] is True
    assert all(torch.equal(upload[k], v) for k, v in ctx.true_gradient().items())
    orthogonal = defenses.build("censor", variant="orthogonal", trials=5, step=100.0)(context())
    assert orthogonal.info["fallback"] is False


def test_censor_official_divides_by_the_norm_not_its_square():
    from gradleak.defenses.censor import orthogonalise

    g = torch.tensor([3.0, 4.0])  # ||g|| = 5
    p = torch.tensor([1.0, 0.0])
    official = orthogonalise(p, g, official=True)
    expected = p - (3.0 / 5.0) * g  # <p, g> / ||g||, not / ||g||^2
    assert torch.allclose(official, expected * (5.0 / expected.norm()))
    assert abs(float(official @ g)) > 1.0  # not orthogonal unless ||g|| = 1
    assert abs(float(orthogonalise(p, g) @ g)) < 1e-5


def test_censor_model_scope_is_orthogonal_over_the_whole_vector_not_per_layer(context):
    """Table VII's whole-vector reading: one projection of the concatenated gradient keeps
    the total norm and is orthogonal as a whole, while single layers keep part of g."""
    ctx = context()
    true = ctx.true_gradient()
    update = defenses.build("censor", trials=1, scope="model")(ctx)
    flat = lambda u: torch.cat([u[k].flatten() for k in true])  # noqa: E731
    cos = torch.nn.functional.cosine_similarity(flat(update), flat(true), dim=0)
    assert abs(float(cos)) < 1e-4
    assert float(flat(update).norm()) == pytest.approx(float(flat(true).norm()), rel=1e-5)
    per_layer = [abs(float(torch.nn.functional.cosine_similarity(
        update[k].flatten(), g.flatten(), dim=0))) for k, g in true.items()]
    assert max(per_layer) > 1e-3
