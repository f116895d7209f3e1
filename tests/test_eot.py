"""The EOT adaptive attack (CENSOR §V-D) on real digits.

Victims: the digits train split, one image per update, a fresh LeNet per victim,
defended by Gaussian noise (sigma 0.01, CENSOR's noise baseline; global clipping at 4,
the defense's default). GGA (Adam, L2 distance) matches its raw trial gradient to the
clipped, noisy upload and fails; wrapped in EOT it matches the expectation of the
defended trial gradient over the noise (the clipped trial), and recovers the digits.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import assert_like_the_loop, stacked_and_looped
from conftest import lenet_victims as victims
from conftest import observe_defended as observe

from gradleak import attacks, defenses, metrics
from gradleak.attacks.eot import DefenseSamples
from gradleak.defenses.base import Defense
from gradleak.types import Update

SIGMA = 0.01


@pytest.fixture(scope="module")
def pool(digits_splits):
    return victims(digits_splits["train"], 3)


@pytest.mark.slow
def test_eot_beats_the_plain_attack_under_dp_noise(pool, digits_generator):
    gga = {"optimizer": "adam", "iterations": 100}
    plain = attacks.build("gga", generator=digits_generator, **gga)
    eot = attacks.build("eot", wraps="gga", wraps_params=gga, generator=digits_generator,
                        defense=defenses.build("dp_gaussian", sigma=SIGMA), samples=5)
    psnr = {"plain": [], "eot": []}
    for v in pool:
        obs = observe(v, "dp_gaussian", sigma=SIGMA)
        psnr["plain"].append(metrics.psnr(plain(obs).images, v[1]))
        psnr["eot"].append(metrics.psnr(eot(obs).images, v[1]))
    print({k: np.round(p, 2).tolist() for k, p in psnr.items()})
    assert all(e >= p for e, p in zip(psnr["eot"], psnr["plain"]))
    assert np.mean(psnr["eot"]) >= np.mean(psnr["plain"]) + 5.0


def test_censor_samples_are_orthogonal_rescaled_and_differentiable(pool):
    """Each EOT sample against CENSOR is Eq. 12 applied to the trial gradient, layer by layer."""
    model, x, y = pool[0]
    obs = observe(pool[0], "censor")
    images = x.clone().requires_grad_(True)
    trial = Update.of(model, images, y, create_graph=True)
    censor = defenses.build("censor")
    draw = DefenseSamples(censor, obs, y, 1, torch.Generator().manual_seed(0))(trial, images)
    for k, g in trial.items():
        o, g = draw[k].detach(), g.detach()
        assert abs(float((o * g).sum() / (o.norm() * g.norm()))) < 1e-4
        assert float(o.norm()) == pytest.approx(float(g.norm()), rel=1e-4)
    mean = DefenseSamples(censor, obs, y, 4, torch.Generator().manual_seed(0))(trial, images)
    (grad_x,) = torch.autograd.grad(sum((v ** 2).sum() for v in mean.values()), images)
    assert float(grad_x.abs().sum()) > 0


def test_eot_wraps_inverting_gradients(pool):
    obs = observe(pool[0], "censor")
    params = {"iterations": 20, "tv": 0.1}
    plain = attacks.build("inverting_gradients", **params)(obs)
    eot = attacks.build("eot", wraps="inverting_gradients", wraps_params=params,
                        defense=defenses.build("censor"), samples=3)(obs)
    assert eot.iterations == 20 and eot.extra["eot_samples"] == 3
    assert eot.loss_trace != plain.loss_trace  # the objective sees the defended trial gradient


class _Detaching(Defense):
    def __call__(self, ctx):
        return {k: v.detach() for k, v in ctx.true_gradient().items()}


def test_eot_rejects_unhooked_attacks_and_non_differentiable_defenses(pool, digits_generator):
    with pytest.raises(ValueError, match="'wraps': 'dlg' is not one of"):
        attacks.build("eot", wraps="dlg", defense="dp_gaussian")
    obs = observe(pool[0], "none")
    eot = attacks.build("eot", wraps="gga", defense=_Detaching(), generator=digits_generator,
                        wraps_params={"optimizer": "adam", "iterations": 2})
    with pytest.raises(ValueError, match="differentiable in the gradient"):
        eot(obs)


@pytest.mark.slow
@pytest.mark.parametrize(("wraps", "params"), [
    ("inverting_gradients", {"iterations": 12, "restarts": 2}),
    ("gga", {"optimizer": "adam", "iterations": 12, "restarts": 2}),
    ("gifd", {"steps": (6, 4), "radii": (0.01,), "restarts": 2})])
@pytest.mark.parametrize("defense", ["dp_gaussian", "censor"])
def test_stacked_eot_draws_and_reconstructs_what_the_loop_does(pool, digits_generator, wraps,
                                                               params, defense, float64):
    """reconstruct_all stacks 3 victims x 2 restarts of EOT (each problem's trial gradient
    formed and sampled on its own, each restart with its own sample generator): the loop's
    images, restarts and loss traces, in float64."""
    model = pool[0][0].double()
    strength = {"sigma": SIGMA} if defense == "dp_gaussian" else {}
    observations = [observe((model, x.double(), y), defense, **strength) for _, x, y in pool]
    eot = {"wraps": wraps, "wraps_params": params, "defense": defenses.build(defense, **strength),
           "samples": 2, "seed": 4}
    if wraps != "inverting_gradients":
        eot["generator"] = copy.deepcopy(digits_generator).double()
    stacked, looped, difference = stacked_and_looped("eot", eot, observations)
    print(f"EOT {wraps} ({defense}) stacked vs loop: max pixel difference {difference:.3g}")
    assert_like_the_loop(stacked, looped, difference, 6)
    draws = 1 if defense == "dp_gaussian" else 2  # DP: its exact expectation, one draw
    assert all(r.extra["eot_samples"] == draws for r in stacked)


def test_every_victim_draws_its_defense_samples_alike(pool):
    """Common random numbers: restart r of every victim draws from a generator seeded
    (seed, r), so stacked victims draw alike at each step, as each does alone."""
    eot = attacks.build("eot", wraps="inverting_gradients", wraps_params={"iterations": 2},
                        defense=defenses.build("dp_gaussian"), samples=1, seed=5)
    same_dtype = [(m, x.to(next(m.parameters()).dtype), y) for m, x, y in pool[:2]]
    one, other = (eot.samples_for(observe(sample, "dp_gaussian")) for sample in same_dtype)
    for restart in (0, 1):
        assert torch.equal(one(restart).rng.get_state(), other(restart).rng.get_state())
    assert not torch.equal(one(0).rng.get_state(), one(1).rng.get_state())
