"""The attack engine runs every attack stacked (victims x restarts as one batch) or one
problem at a time with the same results: Inverting Gradients (Geiping et al., NeurIPS
2020, Eq. 4) on real digits, and every registered attack in float64."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import assert_like_the_loop, stacked_and_looped

from gradleak import attacks, defenses
from gradleak.attacks import stacked_gradients
from gradleak.attacks.bn_statistics import batch_statistics, batchnorm_layers
from gradleak.attacks.lockstep import in_lockstep
from gradleak.attacks.objectives import (
    DISTANCES,
    RESIDUAL_DISTANCES,
    GradientProducts,
)
from gradleak.attacks.optimization import optimize
from gradleak.attacks.stacked_gradients import StackedModel
from gradleak.attacks.stacked_layers import unsupported
from gradleak.attacks.stage import Stage
from gradleak.attacks.victims import Victims
from gradleak.models import LeNet, ResNet
from gradleak.types import Update

SEED = 11


def lenet(channels: int = 1, seed: int = 0) -> LeNet:
    """LeNet with DLG's U(-0.5, 0.5) weights drawn from a seeded generator."""
    model = LeNet(channels, 10, 32, uniform_init=False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.uniform_(-0.5, 0.5, generator=gen)
    return model


def resnet10(seed: int = 0, width: int = 8) -> ResNet:
    """A ResNet-10 (narrow by default, 1 channel) with weights drawn from a seeded generator."""
    model = ResNet(10, 1, 10, 32, width=width)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim > 1:
                bound = param[0].numel() ** -0.5
                param.uniform_(-bound, bound, generator=gen)
            else:  # BatchNorm scale near 1, biases near 0
                param.uniform_(-0.1, 0.1, generator=gen).add_(float(name.endswith("weight")))
    return model


def observe(model, images, labels, batch: int = 1) -> list[attacks.Observation]:
    """One undefended client update per ``batch`` consecutive images, labels known."""
    out = []
    for start in range(0, len(images), batch):
        x, y = images[start:start + batch], labels[start:start + batch]
        grad = defenses.build("none")(defenses.DefenseContext(model=model, x=x, y=y))
        out.append(attacks.Observation(model=model, gradient=grad, batch_size=batch, labels=y))
    return out


def per_victim(name: str, observations, **params) -> list[attacks.Reconstruction]:
    """The engine one problem at a time: victim v as the attack built with seed SEED + v."""
    return attacks.reconstruct_all(attacks.build(name, seed=SEED, **params), observations,
                                   engine="loop")


def stacked(name: str, observations, **params) -> list[attacks.Reconstruction]:
    return attacks.reconstruct_all(attacks.build(name, seed=SEED, **params), observations,
                                   engine="stacked")


def max_diff(a: list[attacks.Reconstruction], b: list[attacks.Reconstruction]) -> float:
    return max(float((x.images - y.images).abs().max()) for x, y in zip(a, b))


def test_signed_default_equals_the_per_victim_loop(digit_batch):
    """Paper configuration (signed Adam, milestones, box), 3 victims x 2 restarts, 50 steps."""
    model = lenet()
    observations = observe(model, *digit_batch)
    params = {"iterations": 50, "tv": 0.1, "restarts": 2}
    loop = per_victim("inverting_gradients", observations, **params)
    attack = attacks.build("inverting_gradients", seed=SEED, **params)
    vectorised = attacks.reconstruct_all(attack, observations)
    print(f"signed: max |vectorised - loop| = {max_diff(vectorised, loop):.3g}")
    assert all(r.extra["vectorised_problems"] == 6 for r in vectorised)
    assert max_diff(vectorised, loop) <= 1e-5
    assert [r.restart for r in vectorised] == [r.restart for r in loop]
    for v, w in zip(vectorised, loop):
        assert v.iterations == w.iterations == 50 and v.stop_reason == "max_iterations"
        assert torch.equal(v.labels, w.labels)
        assert np.allclose(v.loss_trace, w.loss_trace, rtol=1e-4, atol=1e-7)


def test_unsigned_adam_equals_the_per_victim_loop_in_float64(digit_batch, float64):
    """Plain Adam amplifies float32 rounding chaotically; in float64 both paths agree."""
    model = lenet().double()
    observations = observe(model, digit_batch[0].double(), digit_batch[1])
    params = {"iterations": 40, "tv": 0.1, "restarts": 2, "signed": False, "distance": "l2"}
    loop = per_victim("inverting_gradients", observations, **params)
    vectorised = stacked("inverting_gradients", observations, **params)
    print(f"unsigned: max |vectorised - loop| = {max_diff(vectorised, loop):.3g}")
    assert max_diff(vectorised, loop) <= 1e-5
    assert [r.restart for r in vectorised] == [r.restart for r in loop]
    assert all(np.allclose(v.loss_trace, w.loss_trace, rtol=1e-6)
               for v, w in zip(vectorised, loop))


def test_best_restart_has_the_lowest_final_loss_per_victim(digit_batch):
    model = lenet()
    observations = observe(model, *digit_batch)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(3, 4, 1, 1, 32, 32, generator=gen)
    victims = Victims(observations, restarts=4, seed=0, stacked=True)
    run = victims.solve(Stage("cosine", 0.1, 30, regularizers={"tv": 0.1}, signed=True,
                              boxed=True),
                        [images])
    final = run.loss_trace[-1]
    assert torch.equal(run.final_loss(), final)
    assert run.best_restart().tolist() == [int(np.argmin(row)) for row in final.tolist()]
    assert len(set(run.best_restart().tolist())) > 1


def test_a_stage_with_a_cost_minimises_each_victims_own_cost(digit_batch):
    """A misfit that is no gradient distance (R-GAP's Eq. 11 residual): each victim's cost of
    its restarts' rendered images, run by the engine's Adam loop and schedule, the same
    stacked or one problem at a time; a cost stage takes no distance."""
    observations = observe(lenet(), *digit_batch)
    targets = {id(obs): torch.full((1, 1, 32, 32), 0.2 * v) for v, obs in enumerate(observations)}
    stage = Stage(None, 0.1, 40, milestones=(0.5,), regularizers={"tv": 1e-3},
                  draw=lambda obs, rng: [obs.randn((1, 1, 32, 32), rng)],
                  cost=lambda obs: lambda images: (images - targets[id(obs)]).square().flatten(1)
                  .mean(1))
    runs = [Victims(observations, restarts=2, seed=0, stacked=way).solve(stage)
            for way in (True, False)]
    assert torch.equal(runs[0].loss_trace, runs[1].loss_trace)
    assert runs[0].loss_trace.shape == (40, 3, 2)
    assert (runs[0].final_loss() < 0.05 * runs[0].loss_trace[0]).all()
    images = runs[0].images()
    assert all(abs(float(images[v].mean()) - 0.2 * v) < 0.05 for v in range(3))
    with pytest.raises(ValueError, match="a stage with a cost has no trial gradient; expected "
                                         "no distance"):
        Stage("l2", 0.1, 4, cost=stage.cost)


def test_batchnorm_in_training_mode_uses_batch_statistics_like_the_loop(digits):
    """ResNet in training mode: each problem's own batch statistics, as the per-victim
    forward computes them; the caller's running statistics stay untouched."""
    model = resnet10().train()
    observations = observe(model, digits.x[:4], digits.y[:4], batch=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {"iterations": 8, "restarts": 2}
    vectorised = stacked("inverting_gradients", observations, **params)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    loop = per_victim("inverting_gradients", observations, **params)
    print(f"ResNet-10 (train mode): max |vectorised - loop| = {max_diff(vectorised, loop):.3g}")
    assert max_diff(vectorised, loop) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("width", [8, 64])
def test_reconstruct_all_vectorises_batchnorm_models_like_the_loop(digits, width):
    """BatchNorm in training mode: the engine vectorises it (measured faster than the loop
    on ResNet-18) and reconstructs what the loop does; at width 64 through the Gram form."""
    model = resnet10(width=width).train()
    observations = observe(model, digits.x[:2], digits.y[:2])
    params = {"iterations": 4, "restarts": 2}
    chosen = attacks.reconstruct_all(
        attacks.build("inverting_gradients", seed=SEED, **params), observations)
    loop = per_victim("inverting_gradients", observations, **params)
    assert all(r.extra["vectorised_problems"] == 4 for r in chosen)
    assert max_diff(chosen, loop) <= 1e-5


# the papers' distances over one problem's list of per-layer gradients
PER_PROBLEM = {
    "l2": lambda trial, target: sum(((a - b) ** 2).sum() for a, b in zip(trial, target)),
    "ggl": lambda trial, target: sum(((a - b) ** 2).sum() for a, b in zip(trial, target))
    / len(target),
    "cosine": lambda trial, target: 1 - sum((a * b).sum() for a, b in zip(trial, target)) / (
        sum((a * a).sum() for a in trial).sqrt() * sum((b * b).sum() for b in target).sqrt()),
}


@pytest.mark.slow
@pytest.mark.parametrize("distance", sorted(DISTANCES))
@pytest.mark.parametrize("network", ["lenet", "resnet10"])
def test_stacked_distances_and_image_gradients_match_autograd_per_problem(
        network, distance, float64):
    """2 victims x 2 restarts, batches of 2: each problem's distance and its gradient with
    respect to its images are what autograd computes from that problem's own trial
    gradient (BatchNorm in training mode; at width 64 the deep stages take the Gram form)."""
    gen = torch.Generator().manual_seed(4)
    model = (lenet(channels=1) if network == "lenet" else resnet10(width=64)).double().train()
    names = [n for n, _ in model.named_parameters()]
    images = torch.rand(4, 2, 1, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (4, 2), generator=gen)
    victims = [Update.of(model, torch.rand(2, 1, 32, 32, generator=gen), labels[2 * v])
               for v in range(2)]
    targets = {n: torch.stack([g[n] for g in victims]) for n in names}
    expected_values, expected_gradients = [], []
    for p in range(4):
        x = images[p].clone().requires_grad_(True)
        trial = Update.of(model, x, labels[p], create_graph=True)
        value = PER_PROBLEM[distance]([trial[n] for n in names],
                                      [victims[p // 2][n] for n in names])
        expected_values.append(value.detach())
        expected_gradients.append(torch.autograd.grad(value, x)[0])
    stacked = StackedModel(model)
    x = images.clone().requires_grad_(True)
    values = DISTANCES[distance](
        stacked.products(x, labels, targets, distance in RESIDUAL_DISTANCES))
    (gradients,) = torch.autograd.grad(values.sum(), x)
    assert torch.allclose(values, torch.stack(expected_values), rtol=1e-10, atol=1e-12)
    assert torch.allclose(gradients, torch.stack(expected_gradients), rtol=1e-8, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("network", ["lenet", "resnet10"])
def test_formed_gradients_and_their_products_match_autograd_per_problem(network, float64):
    """``StackedModel.gradients`` forms each problem's own trial gradient (what CMA-ES and the
    adaptive transformations need), and ``GradientProducts.formed`` gives the distances the
    product form gives (2 victims x 2 restarts, batches of 2, BatchNorm in training mode)."""
    gen = torch.Generator().manual_seed(6)
    model = (lenet(channels=1) if network == "lenet" else resnet10(width=64)).double().train()
    images = torch.rand(4, 2, 1, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (4, 2), generator=gen)
    stacked = StackedModel(model)
    formed = stacked.gradients(images, labels)
    assert list(formed) == [n for n, _ in model.named_parameters()]
    for p in range(4):
        expected = Update.of(model, images[p], labels[p])
        assert all(torch.allclose(formed[n][p], g, rtol=1e-10, atol=1e-13)
                   for n, g in expected.items())
    targets = {n: torch.randn(2, *g.shape[1:], generator=gen) for n, g in formed.items()}
    for distance, measure in DISTANCES.items():
        residual = distance in RESIDUAL_DISTANCES
        direct = measure(stacked.products(images, labels, targets, residual))
        assert torch.allclose(measure(GradientProducts.formed(formed, targets, residual)),
                              direct, rtol=1e-10, atol=1e-12)


def test_stacked_model_shares_parameters_and_leaves_running_statistics_alone():
    """Per-problem batch statistics and parameter copies give each problem the model's own
    training-mode output; ``model``'s parameters and running statistics are not written."""
    model = ResNet(10, 1, 10, 32, width=64).train()
    x = torch.rand(3, 2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = StackedModel(model)._forward(x, 3).unflatten(0, (3, 2))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    for p in range(3):
        assert torch.allclose(out[p], model(x[p]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_stacked_batchnorm_statistics_are_each_problems_own(mode, float64):
    """GradInversion's R_BN stacked: every BatchNorm layer's per-problem input moments,
    as the per-victim forward hooks record them, in training and in eval mode."""
    model = resnet10(width=8).double().train(mode == "train")
    x = torch.rand(3, 2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    stacked = StackedModel(model)
    stacked._forward(x, 3)
    moments = stacked.batchnorm_statistics()
    assert len(moments) == len(batchnorm_layers(model)) == 12
    for p in range(3):
        for (mean, var), (own_mean, own_var) in zip(moments, batch_statistics(model, x[p])):
            assert torch.allclose(mean[p], own_mean, rtol=1e-10, atol=1e-12)
            assert torch.allclose(var[p], own_var, rtol=1e-10, atol=1e-12)


def test_models_with_other_parametrised_layers_loop(digit_batch):
    """A GroupNorm cannot be stacked: StackedModel says which layer, reconstruct_all loops."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.GroupNorm(2, 4),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 30 * 30, 10))
    model.input_shape = (1, 32, 32)
    assert unsupported(model) == ["1 (GroupNorm)"]
    with pytest.raises(ValueError, match=r"cannot stack problems through 1 \(GroupNorm\)"):
        StackedModel(model)
    assert not unsupported(lenet()) and not unsupported(resnet10())
    observations = observe(model, *digit_batch)[:2]
    looped = attacks.reconstruct_all(
        attacks.build("inverting_gradients", seed=SEED, iterations=2), observations)
    assert all("vectorised_problems" not in r.extra for r in looped)


def test_formed_gradients_stack_only_where_forming_pays(digit_batch, monkeypatch):
    """An L2 distance forms every stacked trial gradient: reconstruct_all stacks it on a
    model within FORMED_PARAMETERS and loops above; cosine (products only) stacks either way."""
    observations = observe(lenet(), *digit_batch)[:2]

    def stacked(distance: str) -> bool:
        attack = attacks.build("inverting_gradients", seed=SEED, iterations=2, distance=distance)
        return all("vectorised_problems" in r.extra
                   for r in attacks.reconstruct_all(attack, observations))

    assert stacked("l2") and stacked("cosine")
    monkeypatch.setattr(stacked_gradients, "FORMED_PARAMETERS", 1000)
    assert not stacked("l2") and stacked("cosine")


def test_a_diverging_problem_is_frozen_without_touching_the_others(digit_batch):
    model = lenet()
    observations = observe(model, *digit_batch)
    broken = dict(observations[1].gradient)
    broken["fc.bias"] = torch.full_like(broken["fc.bias"], float("nan"))
    observations[1] = attacks.Observation(model=model, gradient=broken, batch_size=1,
                                          labels=observations[1].labels)
    params = {"iterations": 20, "tv": 0.1}
    vectorised = stacked("inverting_gradients", observations, **params)
    loop = per_victim("inverting_gradients", observations, **params)
    assert [r.stop_reason for r in vectorised] == ["max_iterations", "diverged", "max_iterations"]
    assert [r.iterations for r in vectorised] == [r.iterations for r in loop] == [20, 0, 20]
    assert max_diff(vectorised, loop) <= 1e-5


def test_an_evaluation_error_in_lockstep_reaches_the_caller():
    """A failing shared evaluation raises in the caller; no thread is left waiting."""
    def evaluate():
        raise FloatingPointError("evaluation failed")

    runs = [lambda objective: optimize([torch.zeros(1, 2, requires_grad=True)], objective,
                                       optimizer="lbfgs", lr=1.0, iterations=3)] * 3
    before = threading.active_count()
    with pytest.raises((FloatingPointError, RuntimeError), match="evaluation failed|failed"):
        in_lockstep(runs, evaluate)
    assert threading.active_count() == before


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plateau", "hybrid"])
def test_each_stacked_problem_stops_on_its_own_like_the_loop(digit_batch, kind, float64):
    """With an EPAFL stopper, reconstruct_all still stacks 3 victims x 2 restarts of
    Inverting Gradients: each problem stops when its own stopper fires,
    as the loop's restart does, with the same images, iterations and reasons."""
    model = lenet().double()
    images, labels = digit_batch
    observations = observe(model, images.double(), labels)
    stopper = {"kind": kind, "patience": 3, "threshold": 0.05}
    params = {"iterations": 60, "tv": 0.1, "lr": 0.3, "restarts": 2,
              "stopper": stopper, "seed": SEED}
    stacked, looped, difference = stacked_and_looped("inverting_gradients", params,
                                                     observations)
    print(f"{kind}: iterations {[r.iterations for r in stacked]}, reasons "
          f"{[r.stop_reason for r in stacked]}, max pixel difference {difference:.3g}")
    assert_like_the_loop(stacked, looped, difference, 6)
    assert len({r.iterations for r in stacked}) > 1 and min(r.iterations for r in stacked) < 60


def test_the_stacked_engine_rejects_mixed_models(digit_batch):
    observations = [observe(lenet(seed=s), *digit_batch)[0] for s in (0, 1)]
    attack = attacks.build("inverting_gradients", iterations=2)
    with pytest.raises(ValueError, match="observation 1 has another model object"):
        attacks.reconstruct_all(attack, observations, engine="stacked")
    assert len(attacks.reconstruct_all(attack, observations)) == 2  # falls back to the loop


@pytest.mark.slow
def test_same_seed_same_bytes_batched_and_looped(digit_batch):
    """Each engine is deterministic: a second run gives the same images and loss traces."""
    observations = observe(lenet(), *digit_batch)
    params = {"iterations": 20, "restarts": 2}

    def both() -> tuple[list, list]:
        batched = attacks.reconstruct_all(
            attacks.build("inverting_gradients", seed=SEED, **params), observations)
        return batched, per_victim("inverting_gradients", observations, **params)

    first, second = both(), both()
    assert "vectorised_problems" in first[0][0].extra
    for run, again in zip(first, second):
        assert max_diff(run, again) == 0
        assert [r.loss_trace for r in run] == [r.loss_trace for r in again]


def test_victims_go_in_chunks_of_bounded_size_with_the_same_results(digit_batch, monkeypatch):
    """A bound of one victim's problems per step gives chunks of one victim, each with its
    own seed, and reconstructs what one stacked step does."""
    observations = observe(lenet(), *digit_batch)
    params = {"iterations": 20, "tv": 0.1, "restarts": 2}
    whole = stacked("inverting_gradients", observations, **params)
    probe = torch.zeros(1, 1, 32, 32)
    largest = StackedModel(observations[0].model).problems_per_step(probe)
    monkeypatch.setattr(stacked_gradients, "STEP_TENSOR_BYTES",
                        stacked_gradients.STEP_TENSOR_BYTES * 2 // largest)
    chunked = stacked("inverting_gradients", observations, **params)
    assert [r.extra["vectorised_problems"] for r in whole] == [6, 6, 6]
    assert [r.extra["vectorised_problems"] for r in chunked] == [2, 2, 2]
    assert max_diff(chunked, whole) <= 1e-6
    assert [r.restart for r in chunked] == [r.restart for r in whole]
