"""GIAS (Jeon et al., NeurIPS 2021) App. D, Fig. A3: inversion from a sequence of gradients,
min_x sum_t c(x[S_t]; theta_t, g_t) with c the Inverting Gradients cost. Real digits (8x8,
LeNet), each victim a client's 8 images uploaded T times, 4 random ones a time, under a
re-initialised or a trained model: the attack job's uploads (``attack.protocol.sequence``), the
engine's sum over them (stacked as one problem at a time), the phase's metrics on the 8
reconstructed images, the target's figure, determinism and the errors of bad values."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gradleak import attacks, data, defenses
from gradleak import config as cfg
from gradleak.attacks.gradient_sequence import ObservedSequence
from gradleak.data import load_digits
from gradleak.experiment import fl_runs, paths, plan
from gradleak.experiment.artifacts import build_defense
from gradleak.experiment.configuration import validate
from gradleak.experiment.job import Job, model_at
from gradleak.experiment.phases.attack import run_attacks
from gradleak.experiment.phases.fl_run import run_fl
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.experiment.phases.target import write_target
from gradleak.experiment.victims import sequence_observations
from gradleak.models import LeNet
from gradleak.settings import Setting
from gradleak.utils.seeding import child_seeds

CASE = "digits-lenet-iid-k4"
ITERATIONS = 100  # Inverting Gradients' signed Adam, lr 0.1, TV 1e-4 (the paper's defaults)
THETAS = ("reinitialised", "trained")


def configuration(sequence: dict | None = None, sweep: dict | None = None,
                  attacks_: dict | None = None, known_labels: bool = True) -> dict:
    """Digits 8x8 on LeNet, 4 clients, one FL round; 2 victims of 8 images, labels known;
    the target ``figa3`` sweeps ``sweep`` (default: T in {1, 8} x both theta settings) and
    draws PSNR against its first swept value, a curve per theta where theta is swept."""
    sweep = sweep or {"attack.protocol.sequence.steps": [1, 8],
                      "attack.protocol.sequence.theta": list(THETAS)}
    figure = {"kind": "line", "x": cfg.sweep_column(next(iter(sweep))), "y": "psnr",
              **({"hue": "theta"} if "attack.protocol.sequence.theta" in sweep else {})}
    return validate({
        "threads": 1, "device": "cpu",
        "datasets": {"digits": {"channels": 1, "size": 8}},
        "cases": [{"dataset": "digits", "model": "lenet", "partition": {"clients": 4}}],
        "fl": {"seeds": [0], "rounds": 1, "eval_every": 1, "client_batch_size": 8},
        "defenses": {"none": {"strengths": [0]}},
        "attack": {"victims": {"count": 2},
                   "protocol": {"batch_size": 8, "sequence": sequence or {}},
                   "attacker": {"known_labels": known_labels},
                   "outputs": {"grid_victims": 2, "metrics": ["psnr", "ssim", "mse"]}},
        "attacks": attacks_ or {"inverting_gradients": {"iterations": ITERATIONS}},
        "targets": {"figa3": {
            "title": "GIAS Fig. A3(b): PSNR against the uploads T",
            "select": [{"sweep": sweep}], "figure": figure}},
    })


def setting(steps: int, theta: str = "trained", **more) -> Setting:
    """The planned setting of T = ``steps`` uploads (the configured theta is dropped)."""
    overrides = {"attack.protocol.sequence.steps": steps, **more}
    if theta != "trained":
        overrides["attack.protocol.sequence.theta"] = theta
    return Setting.of("none", 0, overrides)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The configuration with its data prepared and its one FL run done."""
    results = tmp_path_factory.mktemp("sequence") / "results"
    config = configuration()
    prepare_data(config, results, "digits")
    run_fl(config, results, CASE, plan.NONE, 0)
    return config, results


def attacked(config: dict, results, s: Setting, label: str = "inverting_gradients") -> dict:
    run_attacks(config, results, CASE, s, 0)
    return json.loads(paths.attack_metrics(results, CASE, s, 0).read_text())["runs"][label]


@pytest.fixture(scope="module")
def measured(prepared):
    """PSNR per victim (over its 8 images) of every (T, theta) of the target."""
    config, results = prepared
    return {(steps, theta): attacked(config, results, setting(steps, theta))
            for steps in (1, 8) for theta in THETAS}


def test_sweeps_plan_the_sequence_settings_on_one_fl_run(prepared):
    config, _ = prepared
    assert fl_runs.fl_settings(config) == [(CASE, plan.NONE)]  # attack.* sweeps leave FL alone
    assert [s.text for s in plan.settings(config)] == [
        "none-0~attack.protocol.sequence.steps=1",
        "none-0~attack.protocol.sequence.steps=1~attack.protocol.sequence.theta=reinitialised",
        "none-0~attack.protocol.sequence.steps=8",
        "none-0~attack.protocol.sequence.steps=8~attack.protocol.sequence.theta=reinitialised"]
    assert config["attack"]["protocol"]["sequence"] == {"steps": 0, "subset": 4, "theta": "trained"}


@pytest.mark.slow
def test_more_uploads_reconstruct_the_local_images_better(measured):
    """Fig. A3(b): with T = 8 uploads of 4 of the 8 images the 8 images come back far better
    than from T = 1 (whose 4 unseen images only TV shapes), under both theta settings.
    Measured (2 victims, 100 iterations): T = 1 17.4 dB; T = 8 36.2 dB trained, 42.4 dB
    re-initialised."""
    psnr = {key: np.mean([v["psnr"] for v in run["victims"]]) for key, run in measured.items()}
    print("PSNR (dB):", {f"T={t} {theta}": round(float(p), 2) for (t, theta), p in psnr.items()})
    for theta in THETAS:
        run = measured[8, theta]["victims"]
        assert all(len(v["psnr_per_image"]) == 8 and v["failure"] is None for v in run)
        assert psnr[8, theta] >= psnr[1, theta] + 12
    # theta_1 is the attacked round's model in both settings: one upload is the same run
    assert [v["psnr"] for v in measured[1, "trained"]["victims"]] == \
        [v["psnr"] for v in measured[1, "reinitialised"]["victims"]]


def test_the_target_draws_psnr_against_the_uploads_per_theta(prepared, measured):
    config, results = prepared
    write_target(config, results, "figa3")
    out = paths.target_dir(results, "figa3")
    assert (out / "figa3.png").stat().st_size > 0
    assert json.loads((out / "summary.json").read_text())["name"] == "figa3"


def sequence_victims(config: dict, results, s: Setting) -> tuple[list, list]:
    """The attack job's victims of setting ``s``; the global RNG as it was before."""
    job = Job(config, results, CASE, s, 0)
    train = data.load_prepared(job.data_dir, "train")
    model = model_at(job, train, job.checkpoint)
    defense, seeds = build_defense(job, model), child_seeds(0, ["victims", "defense", "attack"])
    state = torch.get_rng_state()
    out = sequence_observations(job, model, train, defense, seeds)
    assert torch.equal(torch.get_rng_state(), state)
    return out


def test_uploads_and_reconstructions_are_deterministic(prepared):
    """Same configuration and seed, same bytes: every upload, model and subset, and the
    reconstruction; the global RNG is left as it was."""
    config, results = prepared
    for theta in THETAS:
        first, truths = sequence_victims(config, results, setting(8, theta))
        again, _ = sequence_victims(config, results, setting(8, theta))
        for a, b in zip(first, again, strict=True):
            assert a.subsets == b.subsets and len(a.steps) == 8
            assert all(len(s) == 4 for s in a.subsets) and len(set(a.subsets)) > 1
            for x, y in zip(a.steps, b.steps, strict=True):
                assert all(g.numpy().tobytes() == y.gradient[n].numpy().tobytes()
                           for n, g in x.gradient.items())
                assert all(torch.equal(p, q) for p, q in zip(x.model.parameters(),
                                                             y.model.parameters()))
        models = [[s.model for s in obs.steps] for obs in first]
        moved = [any(not torch.equal(p, q) for p, q in zip(m.parameters(),
                                                           models[0][0].parameters()))
                 for m in models[0][1:]]
        assert all(moved)  # theta_t changes with t in both settings
        if theta == "reinitialised":  # one fresh model per step, shared by the victims
            assert all(a is b for a, b in zip(*models))
        else:  # each client's own training
            assert models[0][0] is models[1][0] and models[0][1] is not models[1][1]
        runs = [attacks.reconstruct_all(attacks.build("inverting_gradients", iterations=5,
                                                      seed=3), victims)
                for victims in (first, again)]
        assert all(a.images.numpy().tobytes() == b.images.numpy().tobytes()
                   for a, b in zip(*runs))
        assert all(rec.images.shape == truth[1].shape for rec, truth in zip(runs[0], truths))


def test_bad_values_fail_with_the_key_and_what_was_expected(prepared):
    config, results = prepared
    with pytest.raises(cfg.ConfigError, match=r"'attack.protocol.sequence.subset': 9 images per "
                       r"upload, but 'attack.protocol.batch_size' gives a victim 8 local "
                       r"images; expected at most 8"):
        configuration({"steps": 2, "subset": 9})
    with pytest.raises(cfg.ConfigError, match=r"'attack.attacker.known_labels': true .* got false"):
        configuration({"steps": 2}, known_labels=False)
    with pytest.raises(cfg.ConfigError, match=r"attack.protocol.sequence.theta.*'reinitialized' "
                       r"is not one of \['reinitialised', 'trained'\]"):
        configuration({"steps": 2, "theta": "reinitialized"})
    with pytest.raises(cfg.ConfigError, match=r"attack.protocol.sequence.steps.*-1 is less than "
                       r"the minimum of 0"):
        configuration({"steps": -1})
    # a swept value is checked by the attack job before it makes any upload
    swept = configuration(sweep={"attack.protocol.sequence.subset": [9]},
                          sequence={"steps": 2})
    s = Setting.of("none", 0, {"attack.protocol.sequence.subset": 9})
    with pytest.raises(ValueError, match=r"'attack.protocol.sequence.subset': 9 images per upload"):
        run_attacks(swept, results, CASE, s, 0)
    assert not paths.attack_metrics(results, CASE, s, 0).exists()
    refused = configuration(attacks_={"dlg": {"iterations": 2}},
                            sweep={"attack.protocol.sequence.steps": [2]})
    with pytest.raises(ValueError, match=r"'attack.protocol.sequence.steps': 2 uploads, but "
                       r"attack 'dlg' cannot attack a sequence of uploads; expected attacks "
                       r"whose cost sums over a sequence"):
        run_attacks(refused, results, CASE, setting(2), 0)


# ---------------------------------------------------------------------------------------
# The engine on sequence victims built by hand


def lenet(seed: int) -> LeNet:
    torch.manual_seed(seed)
    return LeNet(1, 10, 8).double()


def by_hand(victims: int = 2, steps: int = 3, local: int = 6, subset: int = 3,
            shared: bool = True) -> list[ObservedSequence]:
    """Undefended uploads of ``subset`` of each victim's ``local`` digits, float64, under one
    LeNet per step (``shared``: the same for every victim)."""
    digits, rng = load_digits(channels=1, size=8), np.random.default_rng(0)
    thetas = [lenet(t) for t in range(steps)]
    out = []
    for v in range(victims):
        chosen = rng.choice(len(digits.x), local, replace=False)
        x, y = digits.x[chosen].double(), digits.y[chosen]
        uploads, subsets = [], []
        for t in range(steps):
            model = thetas[t] if shared or t == 0 else lenet(100 * (v + 1) + t)
            s = np.sort(rng.choice(local, subset, replace=False))
            ctx = defenses.DefenseContext(model=model, x=x[s], y=y[s])
            uploads.append(attacks.Observation(model=model, gradient=defenses.build("none")(ctx),
                                               batch_size=subset, labels=y[s]))
            subsets.append(tuple(s.tolist()))
        out.append(ObservedSequence(model=uploads[0].model, gradient=uploads[0].gradient,
                                    batch_size=local, labels=y, steps=uploads, subsets=subsets))
    return out


@pytest.mark.slow
def test_the_engine_sums_over_the_uploads_stacked_as_one_at_a_time(float64):
    """Inverting Gradients and GI-x on 2 sequence victims x 2 restarts: stacked (one batch,
    the step models shared) gives the loop's reconstructions to 1e-8."""
    victims = by_hand()
    for name, params in (("inverting_gradients", {"iterations": 20, "tv": 0.01,
                                                  "signed": False, "restarts": 2}),
                         ("gias", {"variant": "x", "image_iterations": 20, "signed": False,
                                   "restarts": 2})):
        stacked = attacks.reconstruct_all(attacks.build(name, seed=3, **params), victims,
                                          engine="stacked")
        looped = attacks.reconstruct_all(attacks.build(name, seed=3, **params), victims,
                                         engine="loop")
        assert all(r.extra["vectorised_problems"] == 4 for r in stacked)
        for a, b in zip(stacked, looped, strict=True):
            assert a.images.shape == (6, 1, 8, 8) and a.restart == b.restart
            assert float((a.images - b.images).abs().max()) <= 1e-8
            assert np.allclose(a.loss_trace, b.loss_trace, rtol=1e-8)


def test_the_sequence_cost_is_the_sum_of_the_uploads_costs(float64):
    """The loss of a sequence victim at x is sum_t of the one-upload loss at x[S_t]."""
    from gradleak.attacks.victims import Victims

    victim = by_hand(victims=1)[0]
    stage = attacks.build("inverting_gradients", tv=0.01).stage(None)
    x = torch.rand(1, 6, 1, 8, 8, generator=torch.Generator().manual_seed(1)).double()
    for stacked in (True, False):
        total = Victims([victim], restarts=1, seed=0, stacked=stacked).loss(stage)(x)
        parts = [Victims([step], restarts=1, seed=0, stacked=stacked).loss(stage)(
            x[:, list(subset)]) for step, subset in zip(victim.steps, victim.subsets)]
        assert torch.allclose(total, sum(parts), rtol=1e-12)


def test_sequences_the_engine_cannot_run_are_refused_by_name(float64):
    with pytest.raises(ValueError, match="DLG cannot attack a sequence of uploads"):
        attacks.reconstruct_all(attacks.build("dlg", iterations=1), by_hand(victims=1))
    own = by_hand(shared=False)  # trained theta: each client's own models
    with pytest.raises(ValueError, match="step 1 of observation 1 has another model object"):
        attacks.reconstruct_all(attacks.build("inverting_gradients", iterations=1), own,
                                engine="stacked")
    recs = attacks.reconstruct_all(attacks.build("inverting_gradients", iterations=1), own)
    assert [r.images.shape for r in recs] == [(6, 1, 8, 8)] * 2  # auto: one at a time
    first = own[0]
    with pytest.raises(ValueError, match=r"subset 0 \[0, 9\] must be distinct indices in "
                       r"\[0, 6\)"):
        ObservedSequence(model=first.model, gradient=first.gradient, batch_size=6,
                         labels=first.labels, steps=first.steps, subsets=[(0, 9)] * 3)
    with pytest.raises(ValueError, match="needs the labels of its 6 local images"):
        ObservedSequence(model=first.model, gradient=first.gradient, batch_size=6,
                         steps=first.steps, subsets=first.subsets)
    with pytest.raises(ValueError, match=r"step 0 has labels .*; expected .*, those of its "
                       r"subset"):
        ObservedSequence(model=first.model, gradient=first.gradient, batch_size=6,
                         labels=(first.labels + 1) % 10, steps=first.steps,
                         subsets=first.subsets)
