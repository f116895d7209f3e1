"""RecUP-FL (Cui et al.): gradient features, the adversaries, the model zoo and the defense
(Eqs. 4-9, Alg. 1, Appendix E), on digits with a LeNet and attributes derived from the
images: ``ink`` (the ink-mass tercile within each digit class, 3 classes) and ``top``
(whether the upper half holds more ink than the lower half, 2 classes)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from gradleak import adversaries, defenses
from gradleak.adversaries import (
    ModelZoo,
    features_of,
    gradient_features,
    load_zoo,
    per_sample_gradients,
    save_zoo,
    train_zoo,
)
from gradleak.defenses.recupfl import RecUPFL, flatten, loss_gradient
from gradleak.models import LeNet
from gradleak.types import DefenseContext, Update

SIZE = 64  # feature size: small, so the tests stay fast


def ink_terciles(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample, the tercile (0, 1, 2) of its ink mass among the samples of its class."""
    ink = x.flatten(1).sum(1)
    out = torch.zeros(len(x), dtype=torch.int64)
    for c in y.unique():
        idx = (y == c).nonzero().flatten()
        rank = ink[idx].argsort().argsort()
        out[idx] = rank * 3 // len(idx)
    return out


@pytest.fixture(scope="module")
def setup(digits):
    """A LeNet, per-sample gradient features, two attributes, a train/test split, a zoo."""
    perm = torch.randperm(len(digits.x), generator=torch.Generator().manual_seed(1))[:900]
    x, y = digits.x[perm], digits.y[perm]
    half = x.shape[-2] // 2
    attrs = {"ink": ink_terciles(x, y),
             "top": (x[..., :half, :].sum((1, 2, 3)) > x[..., half:, :].sum((1, 2, 3))).long()}
    torch.manual_seed(0)
    model = LeNet(1, 10, x.shape[-1])
    feats = features_of(model, x, y, SIZE)
    train, test = torch.arange(0, 700), torch.arange(700, 900)
    zoo = train_zoo(feats[train], {a: v[train] for a, v in attrs.items()},
                    {"ink": 3, "top": 2}, size=6, epochs=10, widths=(32, 128), seed=0)
    return dict(x=x, y=y, attrs=attrs, model=model, feats=feats, train=train, test=test,
                zoo=zoo)


@pytest.fixture(scope="module")
def stru_nn(setup):
    """A Stru-NN adversary (§5.4 (1)) trained on clean ink-tercile features."""
    train, ink = setup["train"], setup["attrs"]["ink"]
    return adversaries.build("stru_nn").fit(setup["feats"][train], ink[train])


def context(setup, i: int, seed: int = 0, batch: int = 1, **kwargs) -> DefenseContext:
    s = setup
    part = slice(i, i + batch)
    return DefenseContext(s["model"], s["x"][part], s["y"][part],
                          torch.Generator().manual_seed(seed),
                          attributes={a: v[part] for a, v in s["attrs"].items()}, **kwargs)


def recupfl(setup, **params) -> RecUPFL:
    return defenses.build("recupfl", zoo=setup["zoo"], **params)


def max_abs_diff(a: Update, b: Update) -> float:
    return max(float((a[k] - b[k]).detach().abs().max()) for k in b)


# -- features ------------------------------------------------------------------------------

def test_per_sample_gradients_and_features_match_one_sample_updates(setup):
    s = setup
    x, y, model = s["x"][:5], s["y"][:5], s["model"]
    batched = per_sample_gradients(model, x, y)
    for i in range(5):
        single = Update.of(model, x[i:i + 1], y[i:i + 1])
        assert list(batched) == list(single)
        for k in single:
            torch.testing.assert_close(batched[k][i], single[k], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(gradient_features(single, SIZE), s["feats"][i],
                                   rtol=1e-4, atol=1e-6)
    chunked = features_of(model, x, y, SIZE, chunk=2)
    torch.testing.assert_close(chunked, s["feats"][:5], rtol=1e-4, atol=1e-6)


# -- adversaries ---------------------------------------------------------------------------

@pytest.mark.slow
def test_adversaries_infer_the_attribute_from_clean_gradients(setup, stru_nn):
    s = setup
    feats, ink = s["feats"], s["attrs"]["ink"]
    chance = float(torch.bincount(ink[s["test"]]).max()) / len(s["test"])
    scores = {"stru_nn": stru_nn.score(feats[s["test"]], ink[s["test"]])}
    for name in ["unkwn_nn", "svm", "rf"]:
        # Unkwn-NN's 1024-1024-512-128 takes ~20 s here: the same depth, narrower
        params = {"widths": (128, 128, 64, 32)} if name == "unkwn_nn" else {}
        start = time.perf_counter()
        adversary = adversaries.build(name, **params).fit(feats[s["train"]], ink[s["train"]])
        scores[name] = adversary.score(feats[s["test"]], ink[s["test"]])
        print(name, f"{time.perf_counter() - start:.1f}s")
    print(f"clean ASR on ink tercile (chance {chance:.3f}): {scores}")
    assert sorted(scores) == adversaries.available() == ["rf", "stru_nn", "svm", "unkwn_nn"]
    assert all(score > chance + 0.1 for score in scores.values()), (scores, chance)


def test_adversaries_are_deterministic_and_reject_bad_input(setup):
    s = setup
    feats, ink = s["feats"][s["train"]], s["attrs"]["ink"][s["train"]]
    one = adversaries.build("stru_nn", epochs=2, seed=3).fit(feats, ink).predict(feats)
    two = adversaries.build("stru_nn", epochs=2, seed=3).fit(feats.numpy(), ink.numpy())
    assert (one == two.predict(feats)).all()
    with pytest.raises(ValueError, match="unknown adversary 'cnn'"):
        adversaries.build("cnn")
    with pytest.raises(ValueError, match="one per feature row"):
        adversaries.build("rf").fit(feats, ink[:-1])
    with pytest.raises(RuntimeError, match="not fitted"):
        adversaries.build("svm").predict(feats)


def test_a_neural_adversarys_saved_state_predicts_like_the_fitted_one(setup, stru_nn, tmp_path):
    from gradleak.utils.io import load_torch, save_torch

    feats = setup["feats"][setup["test"]]
    save_torch(tmp_path / "adversary.pt", stru_nn.state())
    restored = adversaries.build("stru_nn").restore(load_torch(tmp_path / "adversary.pt"))
    assert (restored.predict(feats) == stru_nn.predict(feats)).all()
    assert [adversaries.build(n).savable for n in adversaries.available()] == \
        [False, True, False, True]  # rf, stru_nn, svm, unkwn_nn
    with pytest.raises(ValueError, match=r"hidden widths \[1024, 1024, 512, 128\]"):
        adversaries.build("unkwn_nn").restore(stru_nn.state())


# -- model zoo -----------------------------------------------------------------------------

def test_zoo_has_diverse_three_layer_models_and_round_trips(setup, tmp_path):
    zoo = setup["zoo"]
    assert zoo.feature_size == SIZE and zoo.classes == {"ink": 3, "top": 2}
    widths = [tuple(m.widths) for m in zoo.models["ink"]]
    assert len(widths) == 6 and all(len(w) == 3 for w in widths) and len(set(widths)) > 1
    assert all(v in (32, 64, 128) for w in widths for v in w)
    path = save_zoo(tmp_path / "zoo.pt", zoo)
    assert [p.name for p in tmp_path.iterdir()] == ["zoo.pt"]  # no temporary file left
    loaded = load_zoo(path)
    assert loaded.classes == zoo.classes and loaded.feature_size == zoo.feature_size
    feats = setup["feats"][:20]
    for a in zoo.attributes:
        for m, n in zip(zoo.models[a], loaded.models[a]):
            assert torch.equal(m(feats), n(feats))
    again = train_zoo(setup["feats"][:100], {"ink": setup["attrs"]["ink"][:100]}, {"ink": 3},
                      size=2, epochs=2, widths=(32, 128), seed=0)
    assert [m.widths for m in again.models["ink"]] == [m.widths for m in zoo.models["ink"][:2]]


# -- the defense ---------------------------------------------------------------------------

def test_build_fills_the_paper_defaults(setup):
    defense = recupfl(setup)
    assert (defense.iterations, defense.models, defense.variant, defense.momentum) == \
        (10, 5, "meta", 0.9)
    assert defense.protected == ["ink", "top"] and defense.weights == {"ink": 0.5, "top": 0.5}
    assert defense.knob == "epsilon" and defense.strength == defense.epsilon


def _fgsm(w: torch.Tensor, model, label: int, step: float) -> torch.Tensor:
    """One FGSM step on a flattened update, written out independently of the module: the
    sign of d CE / d w by autograd through the pooling and the model."""
    leaf = w.detach().requires_grad_(True)
    features = F.adaptive_max_pool1d(leaf[None, None], SIZE)[0]
    loss = F.cross_entropy(model(features), torch.tensor([label]))
    (grad,) = torch.autograd.grad(loss, leaf)
    return w + step * grad.sign()


def test_meta_iterations_add_the_meta_test_step_only(setup, monkeypatch):
    """Eqs. 5-8: each outer iteration adds w^Q - w^{Q-1}, the meta-test FGSM step taken
    after Q-1 chained meta-train steps of eps/Q from the previous outer iterate."""
    eps, q = 0.01, 4
    defense = recupfl(setup, epsilon=eps, models=q, iterations=3, attributes=["ink"])
    label = int(setup["attrs"]["ink"][0])
    calls = []
    step = defense.meta_step

    def recorded(w, models, labels):
        before, after = step(w, models, labels)
        calls.append((w[0], [row[0] for row in models], before[0], after[0]))
        return before, after

    monkeypatch.setattr(defense, "meta_step", recorded)
    g = flatten(context(setup, 0).true_gradient())
    final = defense.meta(g[None], "ink", torch.tensor([label]),
                         [torch.Generator().manual_seed(0)])[0]
    assert len(calls) == 3
    current = g
    for start, models, before, after in calls:
        assert len(models) == q and len({id(m) for m in models}) == q
        assert torch.equal(start, current)  # each iteration starts from the last w^{p'}
        expected = start
        for model in models[:-1]:  # meta-train, Eq. 5
            expected = _fgsm(expected, model, label, eps / q)
        assert torch.equal(before, expected)
        assert torch.equal(after, _fgsm(before, models[-1], label, eps))  # meta-test, Eq. 6
        delta = after - before
        assert float(delta.abs().max()) == pytest.approx(eps, rel=1e-3)
        current = current + delta  # Eq. 8
    assert torch.equal(final, current)
    assert float((final - g).abs().max()) > 0


def test_loss_gradient_is_autograd_through_pooling_and_model_bit_for_bit(setup):
    """The manual path (FeatureNet.input_gradient, the pooling's scatter) is exact."""
    flat = flatten(context(setup, 4, batch=3).true_gradient())
    for label, model in enumerate(setup["zoo"].models["ink"][:3]):
        leaf = flat.clone().requires_grad_(True)
        features = F.adaptive_max_pool1d(leaf[None, None], SIZE)[0]
        (expected,) = torch.autograd.grad(
            F.cross_entropy(model(features), torch.tensor([label])), leaf)
        got = loss_gradient(flat, model, label, SIZE)
        assert got.numpy().tobytes() == expected.numpy().tobytes()
        assert 0 < int((got != 0).sum()) <= SIZE  # only the window maxima


def test_upload_is_within_p_eps_sum_gamma_of_the_clean_update(setup):
    eps, gamma = 0.02, [0.7, 0.2]
    defense = recupfl(setup, epsilon=eps, gamma=gamma, iterations=4)
    ctx = context(setup, 3, batch=4)
    upload = defense(ctx)
    clean = Update.of(setup["model"], ctx.x, ctx.y)
    diff = max_abs_diff(upload, clean)
    assert 0 < diff <= 4 * eps * sum(gamma) + 1e-6  # 1e-6: float32 rounding
    upload.check(setup["model"], "upload")


def test_zero_gamma_returns_the_clean_update_bit_for_bit(setup):
    ctx = context(setup, 5)
    upload = recupfl(setup, epsilon=0.05, gamma=[0.0, 0.0])(ctx)
    clean = ctx.true_gradient()
    assert list(upload) == list(clean)
    assert all(upload[k].numpy().tobytes() == clean[k].numpy().tobytes() for k in clean)


def test_same_seed_same_upload_bytes(setup):
    defense = recupfl(setup, epsilon=0.01, iterations=3)
    one, two = defense(context(setup, 7, seed=4)), defense(context(setup, 7, seed=4))
    assert all(one[k].numpy().tobytes() == two[k].numpy().tobytes() for k in one)
    other = defense(context(setup, 7, seed=5))
    assert any(not torch.equal(one[k], other[k]) for k in one)


@pytest.mark.parametrize("variant", ["meta", "one_step", "average", "iterative", "momentum"])
def test_every_variant_perturbs_within_its_budget(setup, variant):
    eps = 0.01
    defense = recupfl(setup, epsilon=eps, variant=variant, iterations=2, attributes=["ink"],
                      gamma=[1.0])
    ctx = context(setup, 11)
    upload = defense(ctx)
    budget = 2 * eps if variant == "meta" else eps  # P eps for meta; Eqs. 10-14 once
    assert 0 < max_abs_diff(upload, ctx.true_gradient()) <= budget + 1e-6


def test_momentum_without_momentum_is_iterative_fgsm(setup):
    """Eqs. 13-14 with mu = 0: sign(grad / ||grad||_1) = sign(grad), Eq. 12's step."""
    params = dict(epsilon=0.01, attributes=["ink"], gamma=[1.0])
    momentum = recupfl(setup, variant="momentum", momentum=0.0, **params)(context(setup, 13))
    iterative = recupfl(setup, variant="iterative", **params)(context(setup, 13))
    assert all(torch.equal(momentum[k], iterative[k]) for k in iterative)
    with_mu = recupfl(setup, variant="momentum", **params)(context(setup, 13))
    assert any(not torch.equal(with_mu[k], iterative[k]) for k in iterative)


def test_upload_is_differentiable_in_the_trial_gradient(setup):
    """What an adaptive attacker samples: the perturbation is constant in the gradient."""
    ctx = context(setup, 2)
    trial = ctx.true_gradient().map(lambda t: t.clone().requires_grad_(True))
    upload = recupfl(setup, epsilon=0.01, iterations=2).sample(trial, ctx)
    sum(t.sum() for t in upload.values()).backward()
    assert all(torch.equal(t.grad, torch.ones_like(t)) for t in trial.values())


def test_pseudo_gradient_is_the_update_perturbed(setup):
    s = setup
    pseudo = Update.of(s["model"], s["x"][20:24], s["y"][20:24]).map(lambda t: 3 * t)
    ctx = context(setup, 0, gradient=pseudo)
    upload = recupfl(setup, epsilon=0.001, iterations=2)(ctx)
    assert 0 < max_abs_diff(upload, pseudo) <= 2 * 0.001 + 1e-6


def test_invalid_parameters_and_contexts_fail_clearly(setup):
    zoo = setup["zoo"]
    defaults = dict(iterations=1, models=2, attributes=None, gamma=None, variant="meta",
                    momentum=0.9, zoo_models=None, per_client=False)
    with pytest.raises(ValueError, match="epsilon must be >= 0, got -0.1"):
        RecUPFL(zoo=zoo, epsilon=-0.1, **defaults)
    with pytest.raises(ValueError, match="'epsilon': -0.1 is less than the minimum of 0"):
        recupfl(setup, epsilon=-0.1)  # the schema says it first
    with pytest.raises(ValueError, match=r"models \(Q\) must be >= 2 for variant 'meta'"):
        recupfl(setup, models=1)
    with pytest.raises(ValueError, match="one weight >= 0 per protected attribute"):
        recupfl(setup, gamma=[1.0])
    with pytest.raises(ValueError, match="unknown: \\['age'\\]"):
        recupfl(setup, attributes=["age"])
    with pytest.raises(ValueError, match="zoo has 6 for 'ink'"):
        recupfl(setup, models=7)
    with pytest.raises(ValueError, match="takes 64 features"):
        RecUPFL(zoo=ModelZoo(32, zoo.classes, zoo.models), epsilon=0.1, **defaults)
    defense = recupfl(setup)
    s = setup
    with pytest.raises(ValueError, match="protects attribute 'ink' .* has attributes None"):
        defense(DefenseContext(s["model"], s["x"][:1], s["y"][:1]))
    with pytest.raises(ValueError, match=r"ctx.attributes\['top'\]"):
        defense(DefenseContext(s["model"], s["x"][:1], s["y"][:1],
                               attributes={"ink": s["attrs"]["ink"][:1]}))


def test_zoo_models_uses_the_first_models_of_each_attribute(setup):
    """Fig. 8: ``zoo_models`` N samples only from the first N models of the zoo."""
    defense = recupfl(setup, zoo_models=5)
    assert all(models == setup["zoo"].models[a][:5] for a, models in defense.zoo.models.items())
    rng = torch.Generator().manual_seed(0)
    assert sorted(map(id, defense.sample_models("ink", 5, rng))) == \
        sorted(map(id, setup["zoo"].models["ink"][:5]))
    whole = recupfl(setup, zoo_models=6)(context(setup, 0))
    assert all(torch.equal(whole[k], v) for k, v in recupfl(setup)(context(setup, 0)).items())
    with pytest.raises(ValueError, match=r"zoo_models is 7 .* \{'ink': 6, 'top': 6\}"):
        recupfl(setup, zoo_models=7)
    with pytest.raises(ValueError, match="zoo_models must be a positive integer or null, got 0"):
        RecUPFL.first_models(setup["zoo"], 0)


def test_majority_value_is_the_batch_label(setup):
    defense = recupfl(setup)
    s = setup
    ctx = DefenseContext(s["model"], s["x"][:5], s["y"][:5],
                         attributes={"ink": torch.tensor([2, 0, 2, 1, 0]),
                                     "top": torch.tensor([1, 1, 0, 0, 1])})
    assert defense.batch_label(ctx, "ink") == 0 and defense.batch_label(ctx, "top") == 1


def test_recupfl_lowers_a_stru_nn_adversarys_accuracy(setup, stru_nn):
    """§6: an adversary trained on clean gradients reads defended ones far worse."""
    s, adversary = setup, stru_nn
    ink = s["attrs"]["ink"]
    test = s["test"][:120]
    clean = adversary.score(s["feats"][test], ink[test])
    defense = recupfl(setup, epsilon=0.001, attributes=["ink"])
    defended = torch.stack([gradient_features(defense(context(setup, int(i), seed=int(i))),
                                              SIZE) for i in test])
    score = adversary.score(defended, ink[test])
    chance = float(torch.bincount(ink[test]).max()) / len(test)
    print(f"Stru-NN ASR on ink tercile: clean {clean:.3f}, RecUP-FL eps=0.001 {score:.3f}, "
          f"chance {chance:.3f}")
    assert clean > chance + 0.1
    assert score < clean - 0.15


@pytest.mark.parametrize("variant", ["meta", "one_step", "average", "momentum"])
def test_uploads_made_together_are_each_the_upload_made_alone(setup, variant):
    """``many``: each upload draws with its own generator as if alone; rows that drew the
    same model share its passes, which changes the rounding only (one GEMM for the group
    instead of one per row), not a draw or a step's sign."""
    defense = recupfl(setup, epsilon=0.01, iterations=3, variant=variant)
    made = lambda: [context(setup, i, seed=i, batch=1 + i % 2) for i in range(8)]  # noqa: E731
    together, alone = defense.many(made()), [defense(ctx) for ctx in made()]
    eps_total = 3 * 0.01
    for one, other, ctx in zip(together, alone, made()):
        assert list(one) == list(other)
        assert max_abs_diff(one, other) <= 1e-6 * eps_total + 1e-7
        assert max_abs_diff(one, ctx.true_gradient()) > 0
    assert defense.many(made())[3]["fc.weight"].numpy().tobytes() == \
        together[3]["fc.weight"].numpy().tobytes()  # same rows, same bytes


def test_adaptive_samples_together_draw_as_alone_and_stay_differentiable(setup):
    """EOT's draws of several problems at once (``adaptive_many``): the trial gradients'
    attribute readings and model draws are each problem's own; the draws are
    differentiable in the trial gradients (the perturbation is an offset)."""
    defense = recupfl(setup, epsilon=0.01, iterations=2)
    ctxs = lambda: [DefenseContext(setup["model"], setup["x"][i:i + 1],  # noqa: E731
                                   setup["y"][i:i + 1], torch.Generator().manual_seed(i))
                    for i in range(4)]  # no attributes: the attacker reads them
    trials = [Update({k: v.clone().requires_grad_(True) for k, v in
                      context(setup, i).true_gradient().items()}) for i in range(4)]
    together = defense.adaptive_many(trials, ctxs(), [None] * 4)
    for i, (trial, ctx) in enumerate(zip(trials, ctxs())):
        alone = defense.sample(trial, ctx)
        assert max_abs_diff(together[i], alone) <= 1e-7
        assert all(v.requires_grad for v in together[i].values())
