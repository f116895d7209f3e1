"""Refiner Tables 1-2 (§3.2.2-3): uniform noise on one layer's gradient (``layer_noise``) and
the centralised case the two tables train, planned beside the FL case."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO

from gradleak import defenses
from gradleak.experiment import configuration, plan
from gradleak.models import LeNet


@pytest.fixture()
def context(digits):
    torch.manual_seed(0)
    model = LeNet(1, 10, 32)
    return lambda seed=0: defenses.DefenseContext(
        model=model, x=digits.x[:8], y=digits.y[:8], rng=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layer, changed", [
    (1, {"body.0.weight", "body.0.bias"}), (3, {"body.4.weight", "body.4.bias"}),
    (4, {"fc.weight", "fc.bias"}), (-1, {"fc.weight", "fc.bias"}),
    ("fc", {"fc.weight", "fc.bias"}), ("body.2", {"body.2.weight", "body.2.bias"})])
def test_layer_noise_changes_only_its_layer_within_the_magnitude(context, layer, changed):
    ctx = context()
    true = ctx.true_gradient()
    out = defenses.build("layer_noise", magnitude=0.01, layer=layer)(ctx)
    assert set(out) == set(true)
    assert {k for k in out if not torch.equal(out[k], true[k])} == changed
    for k in changed:
        noise = out[k] - true[k]
        assert noise.abs().max() <= 0.01 + 1e-7 and noise.abs().max() > 0.005
        assert (noise > 0).any() and (noise < 0).any()  # U(-a, a): both signs


def test_layer_noise_is_deterministic_from_the_generator(context):
    defense = defenses.build_at("layer_noise", 0.1, layer=2)
    assert defense.strength == 0.1 and defenses.knob("layer_noise") == "magnitude"
    first, again, other = defense(context(0)), defense(context(0)), defense(context(1))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["body.2.weight"], other["body.2.weight"])


@pytest.mark.parametrize("layer", [0, 5, -5, "conv1", "body.1"])
def test_a_bad_layer_names_the_value_and_the_layers(context, layer):
    defense = defenses.build("layer_noise", layer=layer)
    with pytest.raises(ValueError, match=rf"layer {layer!r} matches no layer of the model; "
                                         r"expected 1 \.\. 4, -4 \.\. -1 or a name prefix, one "
                                         r"of \['body.0', 'body.2', 'body.4', 'fc'\]"):
        defense(context())


def test_refiner_plans_tables_1_and_2_on_the_centralised_case():
    refiner = configuration.load(REPO / "config" / "paper" / "refiner.yaml")
    points = plan.points(refiner)
    table1 = [p for p in points if p.target == "table1"]
    table2 = [p for p in points if p.target == "table2"]
    assert {p.case for p in table1 + table2} == {"cifar10-lenet-iid-k1"}
    assert all(p.attacks == () for p in table1 + table2)
    assert sorted((p.setting.strength, dict(p.swept)["defenses.pruning.params.mode"])
                  for p in table1) == sorted(
        (r, m) for r in (0.2, 0.4, 0.6, 0.8) for m in ("weight", "grad", "weight_grad"))
    assert sorted((p.setting.strength, dict(p.swept)["defenses.layer_noise.params.layer"])
                  for p in table2) == sorted(
        (a, k) for a in (1e-3, 1e-2, 1e-1) for k in (1, 2, 3, 4))
    # centralised: 20 epochs of 50,000 images at batch 512, lr 0.01 (the configured server_lr)
    for p in table1 + table2:
        resolved = plan.resolve(refiner, p.setting)
        assert resolved["fl"]["rounds"] == 1960 and resolved["fl"]["client_batch_size"] == 512
        assert resolved["fl"]["server_lr"] == 0.01 and resolved["fl"]["participation"] == 1.0
    texts = {p.setting.text for p in table1}
    assert "pruning-0.2~fl.client_batch_size=512~fl.rounds=1960~mode=weight_grad" in texts
    # the FL-case targets do not pick up the centralised case or the Table 2 defense
    others = [p for p in points if p.target not in ("table1", "table2", "fig11", "fig12", "fig13")]
    assert {p.case for p in others} == {"cifar10-lenet-iid-k10"}
    assert "layer_noise" not in {p.setting.defense for p in others}
    assert len(refiner["reference"]["table1"]["rows"]) == 12
    assert len(refiner["reference"]["table2"]["rows"]) == 12


def test_a_selection_picks_cases_by_clients():
    built = configuration.validate({
        "cases": [{"dataset": "digits", "model": "lenet"},
                  {"dataset": "digits", "model": "lenet", "partition": {"clients": 1}}],
        "defenses": {"none": {"strengths": [0]}, "layer_noise": {"strengths": [0.1]}},
        "targets": {"t": {"title": "t", "select": [{"clients": [1], "attacks": []}],
                          "table": {"rows": ["defense"], "metrics": ["accuracy"]}}}})
    assert {p.case for p in plan.points(built)} == {"digits-lenet-iid-k1"}


@pytest.mark.parametrize("mode", ["grad", "weight", "weight_grad"])
def test_pruning_over_the_whole_model_keeps_the_largest_scores_anywhere(context, mode):
    ctx = context()
    true = ctx.true_gradient()
    weights = dict(ctx.model.named_parameters())
    model = defenses.build("pruning", ratio=0.6, mode=mode, scope="model")(ctx)
    layer = defenses.build("pruning", ratio=0.6, mode=mode, scope="layer")(ctx)
    score = {"grad": lambda k: true[k].abs(), "weight": lambda k: weights[k].detach().abs(),
             "weight_grad": lambda k: (true[k] * weights[k].detach()).abs()}[mode]
    kept = torch.cat([(model[k] != 0).flatten() for k in true])
    scores = torch.cat([score(k).flatten() for k in true])
    total = scores.numel()
    assert int((~kept).sum()) == int(0.6 * total)
    assert scores[kept].min() >= scores[~kept].max()  # one threshold over every layer
    assert all(torch.equal(model[k][model[k] != 0], true[k][model[k] != 0]) for k in true)
    per_layer = [int((layer[k] == 0).sum()) for k in true]
    assert per_layer == [int(0.6 * true[k].numel()) for k in true]
    assert [int((model[k] == 0).sum()) for k in true] != per_layer
