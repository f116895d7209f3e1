"""The adaptive reconstruction attacker (issue 33): each defense's adaptive transformation
(``Defense.adaptive``), EOT sampling a deterministic one once, the ``attack.attacker.adaptive``
option (rows with ``attacker``), and on real digits the adaptive Inverting Gradients
recovering more than the paper's under pruning 0.9 and the same undefended."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import lenet_victims, tiny_config
from conftest import observe_defended as observe

from gradleak import attacks, defenses, metrics
from gradleak import config as cfg
from gradleak.attacks.eot import DefenseSamples
from gradleak.defenses.soteria import defended_layer
from gradleak.experiment import configuration, paths
from gradleak.experiment.phases.attack import attack_work, run_attacks
from gradleak.experiment.phases.fl_run import run_fl
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.report.tables import privacy_table, tradeoff_table, utility_table
from gradleak.settings import Setting
from gradleak.types import DefenseContext, Update

CASE = "digits-lenet-iid-k4"


@pytest.fixture(scope="module")
def small_digits(digits_splits):
    """The embedded default's victims: 16x16 digits of the train split."""
    from gradleak.data import ImageData

    train = digits_splits["train"]
    x = torch.nn.functional.interpolate(train.x, size=(16, 16), mode="bilinear",
                                        antialias=True, align_corners=False).clamp(0, 1)
    return ImageData(x, train.y, 10)


@pytest.fixture(scope="module")
def pool(small_digits):
    return lenet_victims(small_digits, 3)


def _trial(victim, seed: int = 1) -> tuple[torch.Tensor, Update, DefenseContext]:
    """A differentiable trial gradient of random images, and the victim's context."""
    model, x, y = victim
    images = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    trial = Update.of(model, images, y, create_graph=True)
    return images, trial, DefenseContext(model, x, y, torch.Generator().manual_seed(3))


def _moves_images(images: torch.Tensor, out: Update) -> bool:
    (grad,) = torch.autograd.grad(sum((g ** 2).sum() for g in out.values()), images)
    return float(grad.abs().sum()) > 0


def test_pruning_applies_the_received_zero_pattern(pool):
    obs = observe(pool[0], "pruning", ratio=0.9)
    images, trial, ctx = _trial(pool[0])
    out = defenses.build("pruning", ratio=0.9).adaptive(trial, ctx, obs.gradient)
    for k, g in out.items():
        kept = obs.gradient[k] != 0
        assert torch.equal(g[~kept], torch.zeros_like(g[~kept]))
        assert torch.equal(g[kept], trial[k][kept])
        assert 0 < int(kept.sum()) < kept.numel() or kept.numel() < 10
    assert _moves_images(images, out)


def test_clipping_clips_each_layer_at_the_known_bound_differentiably(pool):
    images, trial, ctx = _trial(pool[0])
    clipping = defenses.build("clipping", bound=0.01)
    out = clipping.adaptive(trial, ctx, observe(pool[0], "clipping", bound=0.01).gradient)
    called = clipping(DefenseContext(ctx.model, ctx.x, ctx.y, gradient=trial.detached()))
    for k, g in out.items():
        assert torch.allclose(g.detach(), called[k], rtol=1e-5, atol=1e-9)
        assert float(g.norm()) <= 0.01 * (1 + 1e-5)
    layer = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda v: clipping.adaptive(Update({"w": v}), ctx, Update())["w"], (layer,))


def test_soteria_leaves_its_pruned_columns_out_of_the_matching(pool):
    obs = observe(pool[0], "soteria", ratio=0.6)
    images, trial, ctx = _trial(pool[0])
    out = defenses.build("soteria", ratio=0.6).adaptive(trial, ctx, obs.gradient)
    key = defended_layer(pool[0][0])
    pruned = (obs.gradient[key] == 0).all(dim=0)
    assert int(pruned.sum()) == int(0.6 * pruned.numel())
    assert torch.equal(out[key][:, pruned], torch.zeros_like(out[key][:, pruned]))
    assert torch.equal(out[key][:, ~pruned], trial[key][:, ~pruned])
    assert all(torch.equal(out[k], trial[k]) for k in trial if k != key)
    # the pruned columns add a constant to the L2 distance: any trial, the same share
    other = Update({k: torch.randn_like(g) for k, g in trial.items()})
    masked = defenses.build("soteria", ratio=0.6).adaptive(other, ctx, obs.gradient)
    assert torch.equal((masked[key] - obs.gradient[key])[:, pruned] ** 2,
                       obs.gradient[key][:, pruned] ** 2)
    assert _moves_images(images, out)


@pytest.mark.parametrize(("name", "params"), [("dp_gaussian", {"sigma": 0.01, "clip": 0.5}),
                                              ("dp_laplace", {"scale": 0.01, "clip": 0.5})])
def test_dp_is_matched_in_expectation_the_clipped_trial(pool, name, params):
    """Zero-mean noise: the adaptive attacker's exact expectation is the clipped trial."""
    images, trial, ctx = _trial(pool[0])
    defense = defenses.build(name, **params)
    assert defense.deterministic
    out = defense.adaptive(trial, ctx, Update(trial).detached())
    norm = float(torch.sqrt(sum((g.detach() ** 2).sum() for g in trial.values())))
    for k in trial:
        assert torch.allclose(out[k], trial[k] * min(1.0, 0.5 / norm), rtol=1e-5, atol=0)
    assert _moves_images(images, out)


@pytest.mark.parametrize(("name", "params"), [("censor", {"trials": 1})])
def test_random_defenses_are_sampled_afresh_each_draw(pool, name, params):
    """EOT over the defense's randomness: each draw a different sample of it, differentiable."""
    obs = observe(pool[0], name, **params)
    images, trial, _ = _trial(pool[0])
    defense = defenses.build(name, **params)
    assert not defense.deterministic
    samples = DefenseSamples(defense, obs, pool[0][2], 1, torch.Generator().manual_seed(0))
    first, second = samples(trial, images), samples(trial, images)
    assert any(not torch.equal(first[k], second[k]) for k in trial)
    assert _moves_images(images, first)


@pytest.mark.parametrize("variant", ["algorithm1", "official", "orthogonal"])
def test_censor_s_clean_gradient_fallback_is_matched_as_it_is(small_digits, variant):
    """Alg. 1's and the official code's fallback uploads the clean gradient: the adaptive
    attacker tells it by its bias signature and matches its trial itself there, an Eq. 12
    draw wherever a candidate was uploaded (and always under the orthogonal reading)."""
    defense = defenses.build("censor", trials=1, variant=variant)
    told = []
    for i, (model, x, y) in enumerate(lenet_victims(small_digits, 12)):
        upload = defense(DefenseContext(model, x, y, torch.Generator().manual_seed(i)))
        _, trial, ctx = _trial((model, x, y))
        out = defense.adaptive(trial, ctx, upload)
        told.append((upload.info["fallback"], all(torch.equal(out[k], trial[k]) for k in trial)))
    assert all(fallback == as_is for fallback, as_is in told)
    assert {fallback for fallback, _ in told} == ({False} if variant == "orthogonal" else
                                                   {True, False})


def test_refiner_none_and_unbiased_noise_match_the_trial_itself(pool):
    """Refiner's upload is the best estimate of the gradient; QSGD and layer noise are
    unbiased, so the upload's expectation is the trial itself."""
    images, trial, ctx = _trial(pool[0])
    stand_in = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(1))  # untrained
    for defense in (defenses.build("none"), defenses.build("refiner", evalnet=stand_in),
                    defenses.build("quantization", bits=1),
                    defenses.build("layer_noise", magnitude=0.1, layer=1)):
        assert defense.deterministic
        out = defense.adaptive(trial, ctx, Update(trial).detached())
        assert all(torch.equal(out[k], trial[k]) for k in trial)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "deterministic"), [
    ("none", True), ("pruning", True), ("clipping", True), ("soteria", True),
    ("quantization", True), ("dp_gaussian", True), ("layer_noise", True), ("censor", False)])
def test_eot_samples_a_deterministic_defense_once(pool, name, deterministic):
    eot = attacks.build("eot", wraps="inverting_gradients", wraps_params={"iterations": 1},
                        defense=name, samples=5)
    assert eot.draws == (1 if deterministic else 5)
    assert eot(observe(pool[0], name)).extra["eot_samples"] == eot.draws


def test_adaptive_labels_must_be_attacks_eot_wraps():
    base = {"attacks": {"dlg": {}, "inverting_gradients": {}}}
    with pytest.raises(cfg.ConfigError, match=r"'attack.attacker.adaptive\[0\]': 'dlg' is not "
                                              r"a configured attack label of"):
        configuration.validate({**base, "attack": {"attacker": {"adaptive": ["dlg"]}}})
    with pytest.raises(cfg.ConfigError, match=r"'attack.attacker.adaptive\[0\]': 'gga' .* "
                                              r"expected one of \['inverting_gradients'\]"):
        configuration.validate({**base, "attack": {"attacker": {"adaptive": ["gga"]}}})
    assert configuration.validate(base)["attack"]["attacker"]["adaptive"] == []
    with pytest.raises(cfg.ConfigError, match=r"'attack.outputs.snapshots' \[10\]: the adaptive "
                                              r"attacker .* records no snapshots"):
        configuration.validate({**base, "attack": {
            "attacker": {"adaptive": ["inverting_gradients"]}, "outputs": {"snapshots": [10]}}})


# measured (2 victims, 16x16 digits, IG 60 iterations): pruning 0.9, paper 6.4 and 6.1 dB,
# adaptive 10.9 and 13.1 dB; undefended identical (15.7, 18.6 dB). At 100 iterations on 3
# victims: 6.6 against 17.6 dB.
IG = {"iterations": 60}


def _psnrs(pool, name: str, **params) -> dict[str, list[float]]:
    paper = attacks.build("inverting_gradients", **IG)
    adaptive = attacks.build("eot", wraps="inverting_gradients", wraps_params=IG,
                             defense=defenses.build(name, **params), samples=1)
    out = {"paper": [], "adaptive": []}
    for victim in pool[:2]:
        obs = observe(victim, name, **params)
        out["paper"].append(float(metrics.psnr(paper(obs).images, victim[1])))
        out["adaptive"].append(float(metrics.psnr(adaptive(obs).images, victim[1])))
    print(name, params, {k: np.round(v, 2).tolist() for k, v in out.items()})
    return out


def test_adaptive_ig_recovers_more_under_pruning_and_the_same_undefended(pool):
    pruned = _psnrs(pool, "pruning", ratio=0.9)
    assert all(a > p for a, p in zip(pruned["adaptive"], pruned["paper"], strict=True))
    assert np.mean(pruned["adaptive"]) >= np.mean(pruned["paper"]) + 4.0
    clean = _psnrs(pool, "none")
    assert np.mean(clean["adaptive"]) == pytest.approx(np.mean(clean["paper"]), abs=0.5)


def small_config() -> dict:
    return tiny_config({"quantization": {"strengths": [2]}},
                       {"inverting_gradients": {"iterations": 3}},
                       attacker={"adaptive": ["inverting_gradients"]})


def test_attack_jobs_write_paper_and_adaptive_rows_deterministically(tmp_path):
    config, results = small_config(), tmp_path / "results"
    setting = Setting.parse("quantization-2")
    prepare_data(config, results, "digits")
    for each in (Setting.parse("none-0"), setting):
        run_fl(config, results, CASE, each, 0)
    metrics_file = paths.attack_metrics(results, CASE, setting, 0)
    def measured() -> dict:  # the metrics but the wall times (a measurement)
        run_attacks(config, results, CASE, setting, 0)
        record = json.loads(metrics_file.read_text())
        for run in record["runs"].values():
            for victim in run["victims"]:
                victim.pop("wall_time")
        return record

    first = measured()
    assert measured() == first  # same configuration and seed, same numbers
    runs = first["runs"]
    assert [v["attacker"] for v in runs["dlg"]["victims"]] == ["paper", "paper"]
    assert "adaptive" not in runs["dlg"]
    ig = runs["inverting_gradients"]
    assert [v["attacker"] for v in ig["victims"]] == ["paper"] * 2 + ["adaptive"] * 2
    assert [v["indices"] for v in ig["victims"][:2]] == [v["indices"] for v in ig["victims"][2:]]
    assert ig["adaptive"] == {"attack": "eot", "samples": 1, "defense": "quantization"}
    details = paths.attack_details(results, CASE, setting, 0)
    assert (details / "recon_inverting_gradients.adaptive.png").is_file()
    privacy = privacy_table([metrics_file])
    assert sorted(privacy.groupby(["attack", "attacker"]).size().items()) == [
        (("dlg", "paper"), 2), (("inverting_gradients", "adaptive"), 2),
        (("inverting_gradients", "paper"), 2)]
    utility = utility_table([paths.fl_metrics(results, CASE, s, 0)
                             for s in (Setting.parse("none-0"), setting)])
    tradeoff = tradeoff_table(utility, privacy)
    assert tradeoff[["attack", "attacker"]].values.tolist() == [
        ["dlg", "paper"], ["inverting_gradients", "adaptive"], ["inverting_gradients", "paper"]]


def test_the_estimate_counts_the_adaptive_attacker():

    config = {"attacks": {"inverting_gradients": {"iterations": 10}},
              "attack": {"victims": {"count": 3}}}
    plain = attack_work(configuration.validate(config), ["inverting_gradients"])
    assert plain == {"adam": 30}
    config["attack"]["attacker"] = {"adaptive": ["inverting_gradients"], "adaptive_samples": 2}
    assert attack_work(configuration.validate(config), ["inverting_gradients"]) == {"adam": 90}
    # a deterministic defense's transformation is drawn once
    assert attack_work(configuration.validate(config), ["inverting_gradients"],
                                deterministic=True) == {"adam": 60}
