"""Every registered attack, and the adaptive attacker through each defense it differentiates,
run by the engine stacked (victims x restarts as one batch) and one problem at a time with
the same results, in float64 on three real digits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_like_the_loop, stacked_and_looped
from test_vectorised import lenet, observe

from gradleak import attacks, defenses


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dlg", "idlg"])
def test_lbfgs_attacks_run_in_lockstep_like_the_loop(digit_batch, name, float64):
    """DLG/iDLG: 3 victims x 2 restarts, each its own L-BFGS and threshold stopper, their
    objectives evaluated as one stacked batch (soft labels for DLG): the loop's losses
    (the first to rounding, then to 1e-3: 20 L-BFGS iterations a step amplify rounding),
    restarts, labels, and where each problem stopped."""
    model = lenet().double()
    observations = observe(model, digit_batch[0].double(), digit_batch[1])
    params = {"iterations": 4, "restarts": 2, "seed": 3,
              "stopper": {"kind": "threshold", "threshold": 5.0, "patience": 1}}
    stacked, looped, _ = stacked_and_looped(name, params, observations)
    assert all(r.extra["vectorised_problems"] == 6 for r in stacked)
    for a, b in zip(stacked, looped):
        assert a.loss_trace[0] == pytest.approx(b.loss_trace[0], rel=1e-12)
        assert np.allclose(a.loss_trace, b.loss_trace, rtol=1e-3)
        assert (a.restart, a.iterations, a.stop_reason) == (b.restart, b.iterations,
                                                            b.stop_reason)
        assert torch.equal(a.labels, b.labels)
    assert {r.stop_reason for r in looped} == {"threshold", "max_iterations"}


# A few iterations of every registered attack, each stage of it and each restart of 2; a
# new attack fails here until it is given its entry.
SMALL = {
    "dlg": {"iterations": 2},
    "idlg": {"iterations": 2},
    "inverting_gradients": {"iterations": 8, "signed": False},
    "gradinversion": {"iterations": 8, "bn": "none", "group_start": 3, "group_every": 2},
    "gga": {"optimizer": "adam", "iterations": 8},
    "gias": {"variant": "z/w", "latent_iterations": 5, "parameter_iterations": 3},
    "giml": {"variant": "w", "parameter_iterations": 4},
    "gifd": {"steps": (4, 3), "radii": (0.05,)},
    "rgap": {},
    "rog": {"iterations": 8},
    "lti": {},
    "fan2025": {"iterations": 4, "channels": 8},
    "eot": {"wraps": "gga", "wraps_params": {"optimizer": "adam", "iterations": 6,
                                             "restarts": 2}, "samples": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("name", attacks.available())
def test_every_registered_attack_runs_stacked_as_one_problem_at_a_time(name, device,
                                                                       digit_batch, float64):
    """The engine's two ways of running an attack stated once: 3 victims x 2 restarts stacked
    through StackedModel, and one problem at a time through autograd on the model, give the
    same images, restarts, iterations, stop reasons and loss traces (float64; on CUDA too
    where there is one)."""
    from gradleak import config
    from gradleak.attacks.lti import Inverter
    from gradleak.models.dcgan import Generator

    assert name in SMALL, f"give {name} an entry in SMALL"
    model = lenet().double().to(device)
    observations = observe(model, digit_batch[0].double().to(device), digit_batch[1].to(device))
    params = {**SMALL[name], "seed": 3}
    if "restarts" in config.parameters("attacks", name):
        params["restarts"] = 2
    torch.manual_seed(0)
    artifacts = {"generator": Generator(16, 1, 8).double(),
                 "defense": defenses.build("dp_gaussian", sigma=0.01),
                 "inverter": Inverter(sum(p.numel() for p in model.parameters()), 8,
                                      tuple(digit_batch[0].shape[1:])).double().eval()}
    wanted = attacks.needs(name, config.resolve("attacks", name, SMALL[name]))
    params.update({k: v for k, v in artifacts.items() if k in wanted})
    stacked, looped, difference = stacked_and_looped(name, params, observations)
    assert {r.images.device.type for r in stacked + looped} == {device}
    print(f"{name}: max pixel difference {difference:.3g}, restarts "
          f"{[r.restart for r in stacked]}")
    if name in ("dlg", "idlg"):  # 20 L-BFGS evaluations a step amplify rounding
        assert difference <= 1e-4 and all(r.extra["vectorised_problems"] == 6 for r in stacked)
        assert [(r.restart, r.iterations, r.stop_reason) for r in stacked] == [
            (r.restart, r.iterations, r.stop_reason) for r in looped]
    else:  # an attack that takes victims one at a time (CMA-ES, R-GAP) stacks its restarts
        built = attacks.build(name, **params)
        assert_like_the_loop(stacked, looped, difference,
                             6 if built.vectorisable else built.restarts)


@pytest.mark.parametrize(("defense", "params"), [
    ("pruning", {"ratio": 0.9}), ("quantization", {"bits": 2}), ("clipping", {"bound": 0.01}),
    ("soteria", {"ratio": 0.6})])
def test_the_adaptive_attacker_runs_stacked_as_one_problem_at_a_time(digit_batch, defense,
                                                                     params, float64):
    """The adaptive attacker (issue 33, EOT through ``Defense.adaptive``, which reads each
    victim's own received upload) stacked as in the loop: 3 defended victims x 2 restarts."""
    model = lenet().double()
    x, y = digit_batch[0].double(), digit_batch[1]
    built = defenses.build(defense, **params)
    observations = [attacks.Observation(
        model=model, batch_size=1, labels=y[v:v + 1], gradient=built(defenses.DefenseContext(
            model, x[v:v + 1], y[v:v + 1], torch.Generator().manual_seed(v))))
        for v in range(len(y))]
    eot = {"wraps": "inverting_gradients", "defense": built, "samples": 1, "seed": 3,
           "wraps_params": {**SMALL["inverting_gradients"], "restarts": 2}}
    stacked, looped, difference = stacked_and_looped("eot", eot, observations)
    print(f"adaptive IG vs {defense}: max pixel difference {difference:.3g}")
    assert_like_the_loop(stacked, looped, difference, 6)
