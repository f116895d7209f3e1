"""RecUP-FL's per-dataset DP clip bounds (`paired`, §5.5), Fig. 7's partition by identity
(§6.4) and its per-client protected attribute, and the paper's numbers in recupfl.yaml."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import REPO

from gradleak import config, data, defenses
from gradleak.adversaries.zoo import train_zoo
from gradleak.data.attributes import CLASSES, stand_in
from gradleak.experiment import configuration, plan
from gradleak.fl.client import client_update
from gradleak.models import LeNet
from gradleak.types import DefenseContext, Update

PAPER = REPO / "config" / "paper" / "recupfl.yaml"


# -- partition by identity -----------------------------------------------------------------

def test_attribute_partition_gives_each_client_whole_groups_and_every_client_samples():
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 300, size=2000) * 7  # group values need not be 0..k-1
    shards = data.partition(np.zeros(2000), "attribute", 100, np.random.default_rng(1),
                            groups=groups)
    assert len(shards) == 100 and all(len(s) for s in shards)
    assert sorted(np.concatenate(shards).tolist()) == list(range(2000))
    owners = {}
    for client, shard in enumerate(shards):
        for group in np.unique(groups[shard]):
            assert owners.setdefault(group, client) == client  # no group spans two clients
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= np.bincount(groups).max()  # as even as groups allow
    again = data.partition(np.zeros(2000), "attribute", 100, np.random.default_rng(1),
                           groups=groups)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again))


def test_attribute_partition_refuses_more_clients_than_groups():
    with pytest.raises(ValueError, match="5 clients, but the samples form 3 groups"):
        data.partition(np.zeros(6), "attribute", 5, np.random.default_rng(0),
                       groups=np.array([0, 0, 1, 1, 2, 2]))
    with pytest.raises(ValueError, match="needs groups"):
        data.partition(np.zeros(6), "attribute", 2, np.random.default_rng(0))


def test_the_lfw_stand_in_person_has_one_value_of_every_attribute():
    lfw = stand_in("lfw", "digits")
    identity = lfw.attributes["identity"].numpy()
    assert "identity" not in CLASSES["lfw"]  # a grouping, not an inferred attribute
    assert len(np.unique(identity)) >= 100  # enough people for the paper's 100 clients
    for name in CLASSES["lfw"]:
        values = lfw.attributes[name].numpy()
        per_person = {(p, v) for p, v in zip(identity, values)}
        assert len(per_person) == len(np.unique(identity)), name


def test_a_case_partitioned_by_an_attribute_is_named_and_checked():
    case = {"dataset": "lfw", "model": "attribute_cnn", "layout": "lfw",
            "partition": {"kind": "attribute", "attribute": "identity", "clients": 10}}
    built = configuration.validate({"datasets": {"lfw": {"stand_in": "digits"}}, "cases": [case]})
    assert plan.case_names(built) == ["lfw-attribute_cnn-byidentity-k10"]
    bad = {**case, "partition": {**case["partition"], "attribute": "person"}}
    with pytest.raises(config.ConfigError, match=r"case lfw/attribute_cnn 'partition.attribute':"
                                                 r" 'person' is not an attribute of dataset "
                                                 r"'lfw'; expected one of \['age', "):
        configuration.validate({"datasets": {"lfw": {"stand_in": "digits"}}, "cases": [bad]})


# -- per-client protected attribute ----------------------------------------------------------

@pytest.fixture(scope="module")
def zoo_setup():
    g = torch.Generator().manual_seed(0)
    model = LeNet(1, 10, 16)
    x, y = torch.rand(1, 1, 16, 16, generator=g), torch.tensor([3])
    size = 64
    features = torch.randn(60, size, generator=g)
    labels = {"race": torch.randint(3, (60,), generator=g),
              "gender": torch.randint(2, (60,), generator=g)}
    zoo = train_zoo(features, labels, {"race": 3, "gender": 2}, size=2, epochs=1,
                    widths=(16, 32), seed=0)
    attributes = {"race": torch.tensor([1]), "gender": torch.tensor([0])}
    return model, x, y, zoo, attributes


def upload(setup, client, **params) -> Update:
    model, x, y, zoo, attributes = setup
    defense = defenses.build("recupfl", zoo=zoo, epsilon=0.01, iterations=1, models=2, **params)
    return defense(DefenseContext(model, x, y, torch.Generator().manual_seed(5),
                                  attributes=attributes, client=client))


def test_per_client_protects_the_clients_own_attribute_alone(zoo_setup):
    both = {"attributes": ["race", "gender"], "per_client": True}
    for client, own in ((0, "race"), (1, "gender"), (6, "race"), (7, "gender")):
        alone = upload(zoo_setup, None, attributes=[own])
        ours = upload(zoo_setup, client, **both)
        assert all(torch.equal(ours[k], alone[k]) for k in alone), client
    mixed = upload(zoo_setup, None, attributes=["race", "gender"])
    assert not all(torch.equal(upload(zoo_setup, 0, **both)[k], mixed[k]) for k in mixed)
    with pytest.raises(ValueError, match="per_client gives each client its own attribute, but "
                                         "this upload has no client index"):
        upload(zoo_setup, None, **both)


def test_an_fl_client_update_carries_the_client_index(zoo_setup):
    model, x, y, _, attributes = zoo_setup
    seen = []

    def defense(ctx: DefenseContext) -> Update:
        seen.append(ctx.client)
        return ctx.true_gradient()

    client_update(model, lambda _s: (x, y, attributes), 1, 0.1, defense,
                  torch.Generator().manual_seed(0), 7)
    client_update(model, lambda _s: (x, y, attributes), 2, 0.1, defense,
                  torch.Generator().manual_seed(0), 3)
    assert seen == [7, 3]


# -- paired sweep values --------------------------------------------------------------------

def paired_config(paired: dict, strengths=(0.01, 0.1)) -> dict:
    return configuration.validate({
        "defenses": {"none": {"strengths": [0]},
                     "dp_gaussian": {"strengths": [0.001, 0.01, 0.1], "params": {"clip": 20.0}}},
        "targets": {"t": {"title": "t", "select": [
            {"defenses": ["dp_gaussian"], "strengths": list(strengths), "attacks": [],
             "paired": paired}],
            "table": {"rows": ["strength", "clip"], "metrics": ["accuracy"]}}}})


def test_paired_values_go_with_their_strength_not_with_every_strength():
    built = paired_config({"defenses.dp_gaussian.params.clip": [22.0, 20.0]})
    points = [p for p in plan.points(built) if p.target == "t"]
    # 20.0 repeats the configured clip: that point is the main run's setting
    assert [p.setting.text for p in points] == ["dp_gaussian-0.01~clip=22.0", "dp_gaussian-0.1"]
    assert [dict(p.swept)["defenses.dp_gaussian.params.clip"] for p in points] == [22.0, 20.0]


@pytest.mark.parametrize("paired, match", [
    ({"defenses.dp_gaussian.params.clip": [22.0]}, "1 value\\(s\\) for 2 strength\\(s\\)"),
    ({"defenses.dp_gaussian.params.clip": [22.0, -1.0]}, "clip"),
    ({"datasets.digits.size": [8, 16]}, "cannot be swept"),
])
def test_bad_paired_values_name_the_key(paired, match):
    with pytest.raises(config.ConfigError, match=match):
        paired_config(paired)


def test_every_recupfl_dp_curve_uses_the_papers_clip_range_per_dataset():
    paper = configuration.load(PAPER)
    ranges = {"audiomnist": (20, 22), "adult": (20, 22), "lfw": (1e-8, 1e-3),
              "celeba": (2e-6, 0.1)}  # §5.5
    seen = set()
    for point in plan.points(paper):
        if point.setting.defense not in ("dp_gaussian", "dp_laplace"):
            continue
        dataset = plan.find_case(paper, point.case)["dataset"]
        name, params = plan.defense_of(paper, point.setting)
        low, high = ranges[dataset]
        assert low <= params["clip"] <= high, (point.target, point.setting.text)
        seen.add(dataset)
    assert seen == set(ranges)
    # a curve's clip falls as its noise rises
    for name in ("fig2", "fig3", "fig10", "fig11"):
        for selection in paper["targets"][name]["select"]:
            for clip in selection.get("paired", {}).values():
                assert clip == sorted(clip, reverse=True), name


def test_recupfl_reference_rows_match_columns_of_their_targets_tables():
    paper = configuration.load(PAPER)
    assert len(paper["reference"]) >= 10
    for name, reference in paper["reference"].items():
        table = paper["targets"][name]["table"]
        keys = [*table["rows"], *table.get("columns", [])]
        metrics = [m for m in reference["columns"] if m not in keys]
        assert metrics and set(metrics) <= set(table["metrics"]), name
        assert "§" in reference["source"], name
