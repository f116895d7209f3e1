"""GIFD (Fang et al., ICCV 2023; CENSOR §II-B) on real digits.

Victims: the digits train split, one image per undefended update, a fresh LeNet per
victim; the prior is the DCGAN trained on the public split. With the same iteration
budget and the same seeds, searching the generator's intermediate features after the
latent (GIFD) matches the gradient better and reconstructs sharper digits than the
latent-only search (GGA-style, GIFD's own stage 0 run for the whole budget).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import lenet_victims as victims
from conftest import stacked_and_looped

from gradleak import attacks, defenses, metrics
from gradleak.attacks.gifd import project_l1_ball


def observe(victim) -> attacks.Observation:
    model, x, y = victim
    ctx = defenses.DefenseContext(model=model, x=x, y=y)
    return attacks.Observation(model=model, gradient=defenses.build("none")(ctx),
                               batch_size=len(x))


@pytest.mark.slow
def test_feature_search_beats_latent_only_search(digits_splits, digits_generator):
    pool = victims(digits_splits["train"], 3)
    latent = attacks.build("gifd", generator=digits_generator, steps=(200,), restarts=1)
    gifd = attacks.build("gifd", generator=digits_generator, steps=(100, 50, 25, 25), restarts=1)
    runs = {"latent": [latent(observe(v)) for v in pool], "gifd": [gifd(observe(v)) for v in pool]}
    loss = {k: np.array([min(r.extra["stage_losses"]) for r in rs]) for k, rs in runs.items()}
    psnr = {k: np.array([metrics.psnr(r.images, v[1]) for r, v in zip(rs, pool)])
            for k, rs in runs.items()}
    for k in runs:
        print(f"{k}: gradient loss {loss[k].tolist()}, PSNR {np.round(psnr[k], 2).tolist()}, "
              f"stage {[r.extra['stage'] for r in runs[k]]}")
    assert all(r.iterations == 200 for rs in runs.values() for r in rs)
    assert all(r.extra["stage"] > 0 for r in runs["gifd"])
    assert np.all(loss["gifd"] < loss["latent"])
    assert psnr["gifd"].mean() >= psnr["latent"].mean() + 3.0


@pytest.mark.slow
@pytest.mark.parametrize(("transform", "stopper"), [
    ("none", None), ("clipping", None), ("none", {"kind": "plateau", "patience": 2})])
def test_stacked_victims_reconstruct_what_the_loop_does(digits_splits, digits_generator,
                                                        transform, stopper, float64):
    """reconstruct_all runs each stage of 3 victims x 2 restarts stacked (the latent, then
    two feature stages inside small l1 balls; with a stopper, each problem's own copy
    per stage): the loop's images, (restart, stage) choices, stage losses, loss traces
    and stop reasons, in float64."""
    pool = victims(digits_splits["train"], 3)
    model = pool[0][0].double()
    observations = [observe((model, x.double(), y)) for _, x, y in pool]
    params = {"generator": copy.deepcopy(digits_generator).double(), "steps": (6, 4, 4),
              "radii": (0.01, 0.01), "restarts": 2, "transform": transform, "seed": 3,
              "stopper": stopper}
    stacked, looped, difference = stacked_and_looped("gifd", params, observations)
    print(f"GIFD ({transform}, stopper {stopper}) stacked vs loop: max pixel difference "
          f"{difference:.3g}, (restart, stage) {[(r.restart, r.extra['stage']) for r in stacked]}"
          f", iterations {[r.iterations for r in stacked]}")
    assert all(r.extra["vectorised_problems"] == 6 for r in stacked)
    assert difference <= 1e-8
    for a, b in zip(stacked, looped):
        assert (a.restart, a.iterations, a.extra["stage"], a.stop_reason) == (
            b.restart, b.iterations, b.extra["stage"], b.stop_reason)
        assert np.allclose(a.extra["stage_losses"], b.extra["stage_losses"], rtol=1e-8)
        assert np.allclose(a.loss_trace, b.loss_trace, rtol=1e-8)


def test_l1_projection_is_the_closest_point_of_the_ball():
    """Duchi et al.'s projection against bisection on the soft threshold, row by row."""
    v = torch.randn(4, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    radius = torch.tensor([1.0, 10.0, 1e3, 50.0])
    out = project_l1_ball(v, radius)
    for row, projected, r in zip(v.flatten(1), out.flatten(1), radius):
        if row.abs().sum() <= r:
            assert torch.equal(projected, row)
            continue
        low, high = 0.0, float(row.abs().max())
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if (row.abs() - mid).clamp(min=0).sum() > r else (low, mid)
        expected = row.sign() * (row.abs() - high).clamp(min=0)
        assert torch.allclose(projected, expected, atol=1e-5)
        assert float(projected.abs().sum()) == pytest.approx(float(r), rel=1e-5)


def test_gifd_rejects_more_stages_than_the_generator_has(digits_generator):
    with pytest.raises(ValueError, match="steps must list 1 to 4"):
        attacks.build("gifd", generator=digits_generator, steps=(10,) * 5)
    with pytest.raises(ValueError, match="radii"):
        attacks.build("gifd", generator=digits_generator, steps=(10, 10), radii=(0.0,))
