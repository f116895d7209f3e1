"""CENSOR's victim protocol and Figs. 2, 3, 10 (issue 31): victims at a stride of a held-out
split or of one class (`data.victims`), the two clients' rounds of Fig. 2 (`fl.mixed`,
`attack.protocol.mixed`), pairwise likeness of one class's reconstructions, proposals from one
public class (`censor.public_class`), Table II's batches of distinct labels."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import REPO, tiny_config

from gradleak import config as cfg
from gradleak import data, defenses, models
from gradleak.data import victims as victim_images
from gradleak.experiment import configuration, paths, plan
from gradleak.experiment.job import Job, model_at
from gradleak.experiment.phases.attack import run_attacks
from gradleak.experiment.phases.fl_run import run_fl
from gradleak.experiment.phases.prepare_data import prepare_data, victim_problems
from gradleak.experiment.records import add_likeness
from gradleak.experiment.victims import observations, victim_batches
from gradleak.fl.mixed import two_client_rounds, weighted_mean
from gradleak.settings import Setting
from gradleak.types import Update
from gradleak.utils.seeding import child_seeds

CASE = "digits-lenet-iid-k4"
NONE = Setting.parse("none-0")
CENSOR = REPO / "config" / "paper" / "censor.yaml"


def spec(**changes) -> dict:
    """A validated `attack:` section with ``changes`` (its subsections' values)."""
    return configuration.validate({"attack": changes})["attack"]


def test_stride_takes_every_stride_th_image_of_the_pool_in_order():
    labels = np.arange(40) % 4
    batches = victim_images.strided(labels, spec(victims={"count": 3, "stride": 5},
                                                 protocol={"batch_size": 2}))
    assert [b.tolist() for b in batches] == [[0, 5], [10, 15], [20, 25]]
    of_class = victim_images.strided(labels, spec(victims={"count": 2, "stride": 3, "class": 1}))
    assert [b.tolist() for b in of_class] == [[1], [13]]  # class 1 at 1, 5, 9, 13, ...


def test_default_victims_are_drawn_as_before():
    """Without stride or class the draw is the earlier one: other configurations attack
    exactly the same images."""
    labels = np.arange(500) % 10
    attack = spec(victims={"count": 4}, protocol={"batch_size": 3})
    ours = victim_batches(labels, attack, np.random.default_rng(7))
    chosen = np.random.default_rng(7).choice(len(labels), 12, replace=False)
    assert [b.tolist() for b in ours] == [np.sort(chosen[v * 3:(v + 1) * 3]).tolist()
                                          for v in range(4)]


def test_victims_of_one_class_are_disjoint_and_of_that_class():
    labels = np.arange(600) % 10
    batches = victim_batches(labels, spec(victims={"count": 6, "class": 2}),
                                     np.random.default_rng(0))
    flat = np.concatenate(batches)
    assert len(set(flat.tolist())) == 6 and set(labels[flat].tolist()) == {2}


@pytest.mark.parametrize("changes, counts, expected", [
    ({"victims": {"count": 10, "stride": 1000, "split": "test"}}, {"test": [36] * 10},
     ["'attack.victims.stride' 1000", "need 9001 images", "test split of 'digits' holds 360",
      "at most 39"]),
    ({"victims": {"count": 6, "class": 7}}, {"train": [5] * 7 + [0] * 3},
     ["'attack.victims.class' 7", "no image of class 7", "7 classes"]),
    ({"victims": {"count": 6, "class": 2}}, {"train": [5] * 10},
     ["6 x 1 = 6 distinct images", "train split of 'digits' (class 2) holds 5"]),
    ({"victims": {"stride": 10, "distinct_labels": True}, "protocol": {"batch_size": 2}},
     {"train": [50] * 10},
     ["'attack.victims.stride' 10 takes fixed images", "'attack.victims.distinct_labels'"]),
    ({"victims": {"split": "test"}}, {"all": [50] * 10},
     ["'attack.victims.split' 'test' is not a split"]),
    ({"protocol": {"mixed": {"batch_size": 500}}}, {"train": [50] * 10},
     ["'attack.protocol.mixed.batch_size' 500", "holds 496"]),
])
def test_problem_names_the_key_the_value_and_what_fits(changes, counts, expected):
    why = victim_images.problem(spec(**changes), counts, "digits")
    assert why is not None and all(part in why for part in expected), why


def test_a_stride_beyond_the_split_is_a_config_error():
    with pytest.raises(cfg.ConfigError,
                       match=r"'attack.victims.stride' 1000: 10 victims .* need 9001"):
        configuration.validate({"cases": [{"dataset": "digits", "model": "lenet"}],
                                "attacks": {"dlg": {}},
                                "attack": {"victims": {"count": 10, "split": "test",
                                                       "stride": 1000}}})


small_config = tiny_config


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The digits prepared once, and the FL run whose round-0 model the attacks load."""
    results = tmp_path_factory.mktemp("censor") / "results"
    config = small_config()
    prepare_data(config, results, "digits")
    run_fl(config, results, CASE, NONE, 0)
    return results


def test_prepared_splits_are_checked_before_any_job(prepared):
    # 371 images of the 359 held out
    config = small_config(victims={"split": "test", "stride": 370})
    found = victim_problems(config, prepared)
    assert len(found) == 1 and "setting 'none-0' of case" in found[0]
    assert "'attack.victims.stride' 370" in found[0] and "holds 359" in found[0]
    with pytest.raises(ValueError, match="'attack.victims.stride' 370"):
        run_attacks(config, prepared, CASE, NONE, 0)
    assert victim_problems(small_config(victims={"split": "test", "stride": 100}), prepared) == []


def test_prepare_data_refuses_victims_its_splits_cannot_give(tmp_path):
    """On a fresh run the check comes when the data are prepared, before any FL run."""
    with pytest.raises(ValueError, match=r"the train split of 'digits' \(class 3\) holds"):
        prepare_data(small_config(victims={"class": 3, "count": 200}), tmp_path, "digits")


def observed(config: dict, results) -> tuple[list, list, torch.nn.Module]:
    job = Job(config, results, CASE, NONE, 0)
    train = data.load_prepared(job.data_dir, "train")
    model = model_at(job, train, job.checkpoint)
    seeds = child_seeds(0, ["victims", "defense", "attack"])
    return (*observations(job, model, train, defenses.build("none"), seeds), model)


def test_held_out_victims_at_a_stride(prepared):
    config = small_config(victims={"split": "test", "stride": 100})
    observations, truths, model = observed(config, prepared)
    test = data.load_prepared(paths.data_dir(prepared, "digits"), "test")
    assert [t[0].tolist() for t in truths] == [[0], [100]]
    assert torch.equal(truths[1][1], test.x[100:101]) and observations[0].model is model


def test_fig2_observes_the_victims_own_upload_after_two_clients_rounds(prepared):
    """With attack.protocol.mixed the attacked model is the round-0 model after `round` rounds of
    the victim and another client; the attacker sees the victim's own gradient there."""
    config = small_config(victims={"split": "test", "stride": 100},
                          protocol={"round": 2, "mixed": {"batch_size": 32}})
    assert plan.checkpoint_rounds(config) == [0]
    observations, truths, model = observed(config, prepared)
    again, _, _ = observed(config, prepared)
    for obs, twin, (_, x, y) in zip(observations, again, truths):
        assert obs.model is not model
        moved = sum(float((p - q).detach().abs().sum())
                    for p, q in zip(obs.model.parameters(), model.parameters()))
        assert moved > 0
        own = Update.of(obs.model, x, y)
        assert all(torch.allclose(obs.gradient[k], own[k], atol=1e-6) for k in own)
        assert all(torch.equal(obs.gradient[k], twin.gradient[k]) for k in own)  # seeded


def test_two_client_rounds_apply_the_batch_weighted_mean_of_both_uploads():
    """Each round the server applies (1 g_victim + B g_other) / (1 + B): for FedSGD the
    gradient of the mean loss over all 1 + B images, one round of 1 + B one-image clients."""
    torch.manual_seed(0)
    model = models.build("lenet", 1, 10, 16)
    victim = (torch.rand(1, 1, 16, 16), torch.tensor([3]))
    pool = torch.rand(3, 8, 1, 16, 16), torch.randint(0, 10, (3, 8))

    def other(r, _step):
        return pool[0][r], pool[1][r]

    start = copy.deepcopy(model)
    trained, applied = two_client_rounds(model, victim, other, 3, 1, 0.1, "sgd", 0.5,
                                         defenses.build("none"), torch.Generator())
    theta = copy.deepcopy(start)
    for r, aggregate in enumerate(applied):
        x, y = torch.cat([victim[0], pool[0][r]]), torch.cat([victim[1], pool[1][r]])
        pooled = Update.of(theta, x, y)
        weighted = weighted_mean([Update.of(theta, *victim), Update.of(theta, *other(r, 0))],
                                 [1, 8])
        for k in pooled:
            assert torch.allclose(aggregate[k], pooled[k], atol=1e-6)
            assert torch.allclose(aggregate[k], weighted[k], atol=1e-6)
        with torch.no_grad():
            for name, param in theta.named_parameters():
                param.sub_(0.5 * aggregate[name])
    for p, q in zip(trained.parameters(), theta.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    for p, q in zip(model.parameters(), start.parameters()):
        assert torch.equal(p, q)  # the FL run's model is not changed


def test_likeness_of_identical_reconstructions_is_one():
    images = [torch.rand(1, 1, 16, 16) for _ in range(3)]
    same = [images[0]] * 3
    records = [{} for _ in range(3)]
    add_likeness(records, same, [(None, image, None) for image in images])
    assert all(r["pairwise_ssim"] == pytest.approx(1.0) for r in records)
    assert all(r["truth_pairwise_ssim"] < 0.5 for r in records)


def test_censor_public_class_keeps_that_class_and_names_a_missing_one():
    x, y = torch.rand(20, 1, 16, 16), torch.arange(20) % 5
    censor = defenses.build("censor", proposal="public", public_class=3, public=(x, y))
    assert censor.public[1].tolist() == [3] * 4
    with pytest.raises(ValueError, match="public_class 7: the public images have no image"):
        defenses.build("censor", proposal="public", public_class=7, public=(x, y))
    with pytest.raises(ValueError, match="expected proposal 'public'"):
        defenses.build("censor", public_class=3)


@pytest.mark.parametrize("scale", ["full", "smoke"])
def test_censor_table2_batches_hold_distinct_labels(scale):
    """Table II (§V-B): "no duplicate labels are present in each batch"; every B = 4 batch
    drawn for its settings, on ImageNet's held-out split (1,000 classes, 10 each) or the
    smoke stand-in's digits."""
    config = configuration.validate({**cfg.read(CENSOR), "scale": scale})
    points = [p for p in plan.points(config) if p.target == "table2"]
    assert len(points) == 6
    rng = np.random.default_rng(0)
    images, classes = (360, 10) if scale == "smoke" else (10000, 1000)
    labels = rng.permutation(np.arange(images) % classes)
    for point in points:
        attack = plan.resolve(config, point.setting)["attack"]
        assert (attack["protocol"]["batch_size"], attack["victims"]["distinct_labels"],
                attack["victims"]["stride"]) == (4, True, 0)
        assert victim_images.problem(attack, {"test": np.bincount(labels).tolist()},
                                     "imagenet") is None
        for batch in victim_batches(labels, attack, np.random.default_rng(1)):
            assert len(set(labels[batch].tolist())) == 4


def test_censor_protocol_victims_fit_every_dataset():
    """§V-B: every 1,000th image of each held-out split, ten victims: 9,001 images needed,
    at most the split's upper bound for ImageNet, FFHQ and CIFAR-10."""
    config = configuration.load(CENSOR)
    assert (config["attack"]["victims"]["split"], config["attack"]["victims"]["stride"]) == \
        ("test", 1000)
    for case in config["cases"]:
        assert configuration.split_capacity(config, case["dataset"], "test") >= 9001
