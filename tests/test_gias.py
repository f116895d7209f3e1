"""GIAS (Jeon et al., NeurIPS 2021) on real digits: the search-space ordering of Table 1.

Setting, scaled down from App. H (ImageNet 64x64, ResNet-18, batch 4, StyleGAN2):
victims from the digits train split (32x32, 1 channel) in batches of 4 with
distinct labels, labels known (Eq. 3 assumes the true labels); the generator is
the DCGAN trained on the disjoint public split (``digits_generator``). The model
is DLG's LeNet with a BatchNorm2d after each convolution: the cheapest BatchNorm
model, needed because "+BN" matches the client's exact BN statistics (the
paper's ResNet-18 has BatchNorm). Budgets are cut to run on one CPU thread:
100 latent iterations x 2 restarts then 200 parameter iterations, and GI-x gets
the same number of cost evaluations (2 restarts x 200 iterations).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import stacked_and_looped
from torch import nn

from gradleak import attacks, defenses, metrics
from gradleak.attacks.bn_statistics import batch_statistics
from gradleak.attacks.prior import to_model_input
from gradleak.attacks.victims import Victims
from gradleak.models import LeNet

BATCH = 4
LATENT, PARAMETER, RESTARTS = 100, 200, 2
IMAGE = LATENT + PARAMETER // RESTARTS  # GI-x: as many cost evaluations as GI-z/w


@pytest.fixture(autouse=True)
def _native_convolutions():
    """oneDNN is ~2x slower than the native kernels on these tiny double-backward convolutions."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    yield
    torch.backends.mkldnn.enabled = enabled


def lenet_bn(seed: int) -> LeNet:
    """LeNet (DLG's U(-0.5, 0.5) init) with a BatchNorm2d after each convolution."""
    torch.manual_seed(seed)
    model = LeNet(1, 10, 32)
    convs = [m for m in model.body if isinstance(m, nn.Conv2d)]
    model.body = nn.Sequential(*(layer for conv in convs
                                 for layer in (conv, nn.BatchNorm2d(conv.out_channels),
                                               nn.Sigmoid())))
    return model


def victim_batches(images, count: int, seed: int = 2024):
    """``count`` (model, x, y) batches of BATCH images with distinct labels, no image reused."""
    order = np.random.default_rng(seed).permutation(len(images.y)).tolist()
    out = []
    for i in range(count):
        picked: list[int] = []
        while len(picked) < BATCH:
            j = order.pop(0)
            if all(images.y[j] != images.y[k] for k in picked):
                picked.append(j)
        out.append((lenet_bn(i), images.x[picked], images.y[picked]))
    return out


def observe(model, x, y, **defense) -> attacks.Observation:
    ctx = defenses.DefenseContext(model=model, x=x, y=y)
    grad = defenses.build(defense.pop("name", "none"), **defense)(ctx)
    return attacks.Observation(model=model, gradient=grad, batch_size=len(x), labels=y,
                               bn_statistics=batch_statistics(model, x))


def test_arguments_are_checked(digits_splits):
    with pytest.raises(ValueError, match="'variant': 'x/z' is not one of"):
        attacks.build("gias", variant="x/z")
    with pytest.raises(ValueError, match="giml's generator is the meta-learned one"):
        attacks.build("giml", prior="untrained")
    with pytest.raises(ValueError, match="needs generator="):
        attacks.build("gias")
    model, x, y = victim_batches(digits_splits["train"], 1)[0]
    obs = observe(model, x, y)
    obs.bn_statistics = None
    with pytest.raises(ValueError, match="needs obs.bn_statistics"):
        attacks.build("gias", variant="x+BN", image_iterations=1)(obs)
    plain = LeNet(1, 10, 32)  # no BatchNorm layer to match the statistics with
    obs = attacks.Observation(model=plain, gradient=defenses.build("none")(
        defenses.DefenseContext(model=plain, x=x, y=y)), batch_size=BATCH, labels=y,
        bn_statistics=batch_statistics(model, x))
    with pytest.raises(ValueError, match="needs a model with BatchNorm layers; LeNet has none"):
        attacks.build("gias", variant="x+BN", image_iterations=1)(obs)


def test_gi_z_is_the_latent_stage_of_gi_z_w(digits_splits, digits_generator):
    """Alg. 1: GI-z/w's latent search is GI-z (same seed, same restarts), then the weights move."""
    model, x, y = victim_batches(digits_splits["train"], 1, seed=1)[0]
    obs = observe(model, x, y)
    z_only = attacks.build("gias", generator=digits_generator, variant="z", latent_iterations=6,
                           restarts=2, seed=3)(obs)
    z_w = attacks.build("gias", generator=digits_generator, variant="z/w", latent_iterations=6,
                        parameter_iterations=4, restarts=2, seed=3)(obs)
    assert torch.equal(z_only.extra["latent"], z_w.extra["latent"])
    with torch.no_grad():
        latent_images = to_model_input(digits_generator(z_only.extra["latent"]), (1, 32, 32))
    assert torch.allclose(z_only.images, latent_images)
    assert z_w.extra["iterations"] == {"z": 6, "w": 4} and z_w.iterations == 10
    assert z_w.loss_trace[:6] == z_only.loss_trace and len(z_w.loss_trace) == 10
    assert not torch.allclose(z_w.images, z_only.images)


def test_gi_z_x_searches_pixels_from_the_image_of_the_best_latent(digits_splits,
                                                                 digits_generator):
    """GI-z/x (Fig. 3): GI-z's latent search, then GI-x's pixel search from G(z*), which
    lowers the cost further."""
    model, x, y = victim_batches(digits_splits["train"], 1, seed=1)[0]
    obs = observe(model, x, y)
    common = dict(generator=digits_generator, latent_iterations=6, restarts=2, seed=3)
    z_only = attacks.build("gias", variant="z", **common)(obs)
    z_x = attacks.build("gias", variant="z/x", image_iterations=40, **common)(obs)
    assert torch.equal(z_only.extra["latent"], z_x.extra["latent"])
    assert z_x.extra["iterations"] == {"z": 6, "x": 40} and z_x.iterations == 46
    assert z_x.loss_trace[:6] == z_only.loss_trace and z_x.restart == z_only.restart
    print(f"cost: GI-z {z_only.loss_trace[-1]:.4f}, GI-z/x {z_x.loss_trace[-1]:.4f}")
    assert z_x.loss_trace[-1] < z_only.loss_trace[-1]


def test_an_untrained_prior_is_the_generator_architecture_with_seeded_weights():
    """Table 1's GI-w "untrained": ``prior: untrained`` asks the pipeline for the prior's
    architecture with DCGAN's initial weights, the same for the same seed."""
    from gradleak import config
    from gradleak.models.dcgan import untrained_generator

    def needs(**params):
        return attacks.needs("gias", config.resolve("attacks", "gias", params))

    assert needs(variant="w", prior="untrained") == {"generator": "untrained_gan"}
    assert needs(variant="z/w") == {"generator": "gan"}
    assert needs(variant="x+BN", prior="untrained") == {}
    a, b, c = (untrained_generator(16, 1, 8, seed) for seed in (0, 0, 1))
    z = torch.randn(2, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(z), b(z)) and not torch.allclose(a(z), c(z))
    assert not a.training and a(z).shape == (2, 1, 32, 32)


def test_sparsified_cost_masks_the_trial_gradient(digits_splits):
    """sim_cmpr: with the observed top-k mask the true batch has zero cost under 90% pruning."""
    model, x, y = victim_batches(digits_splits["train"], 1, seed=2)[0]
    obs = observe(model, x, y, name="pruning", ratio=0.9)

    def cost(**params) -> float:
        victims = Victims([obs], restarts=1, seed=0, stacked=False)
        attack = attacks.build("gias", variant="x", tv=0.0, **params)
        return float(victims.loss(attack.stage(victims, "x"))(x.unsqueeze(0))[0])

    masked, observed, plain = cost(sparsity=0.9), cost(sparsity="observed"), cost()
    print(f"cost of the true batch: masked {masked:.2e}, observed {observed:.2e}, "
          f"plain {plain:.3f}")
    assert max(masked, observed) < 1e-5 < 0.05 < plain
    # `observed` follows the upload's own pruning level: its non-zeros, the official top
    # 10 % under 90 % pruning up to the entry int((1 - 0.9) n) rounds away
    from gradleak.attacks.gias import sparsity_masks
    pruned = list(obs.gradient.values())
    for g, own, official in zip(pruned, sparsity_masks(pruned, 0.0), sparsity_masks(pruned, 0.9),
                                strict=True):
        assert torch.equal(own, (g != 0).to(g.dtype))
        assert bool((official <= own).all()) and 0 <= float(own.sum() - official.sum()) <= 1


@pytest.mark.slow
def test_table1_ordering_on_digits(digits_splits, digits_generator):
    """Table 1: GI-x < GI-z < GI-z/w <= GI-z/w+BN and GI-x+BN <= GI-z/w+BN in mean PSNR
    over the same 8 victims.

    GI-z is read from GI-z/w's latent stage (identical, see the test above)."""
    batches = victim_batches(digits_splits["train"], 2)
    psnr: dict[str, list[float]] = {"x": [], "z": [], "z/w": [], "x+BN": [], "z/w+BN": []}
    for seed, (model, x, y) in enumerate(batches):
        obs = observe(model, x, y)
        common = dict(generator=digits_generator, restarts=RESTARTS, seed=seed)
        for variant in ("x", "z/w", "x+BN", "z/w+BN"):
            rec = attacks.build("gias", variant=variant, image_iterations=IMAGE,
                                latent_iterations=LATENT, parameter_iterations=PARAMETER,
                                **common)(obs)
            psnr[variant].extend(metrics.psnr(rec.images, x, reduction="none"))
            if variant == "z/w":
                with torch.no_grad():
                    latent = to_model_input(digits_generator(rec.extra["latent"]), (1, 32, 32))
                psnr["z"].extend(metrics.psnr(latent, x, reduction="none"))
    mean = {k: float(np.mean(v)) for k, v in psnr.items()}
    print("GIAS mean PSNR over 8 digits:", {k: round(v, 2) for k, v in mean.items()})
    assert mean["z"] > mean["x"] + 2.0  # the public-split GAN is a usable prior
    assert mean["z/w"] > mean["z"] + 2.0
    assert mean["z/w"] > mean["x"] + 4.0
    assert mean["z/w+BN"] >= mean["z/w"]
    assert mean["z/w+BN"] >= mean["x+BN"]


PLATEAU = {"kind": "plateau", "patience": 2}


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "stopper"), [
    ("x", None), ("z/w", None), ("x+BN", None), ("z/w+BN", None), ("w", None),
    ("z/w", PLATEAU), ("w", PLATEAU)])
def test_stacked_victims_reconstruct_what_the_per_victim_loop_does(digits_splits,
                                                                  digits_generator, variant,
                                                                  stopper, float64):
    """reconstruct_all stacks the image (GI-x), latent (GI-z/w) or parameter (GI-w) searches
    of 3 victims x 2 restarts of one BatchNorm model (batches of 4), R_BN from each
    problem's own BatchNorm inputs (+BN), then GI-z/w's parameter searches of the 3
    victims (one generator copy per image), with a stopper per problem and stage when
    given: the loop's results, in float64 (plain Adam amplifies float32 rounding)."""
    batches = victim_batches(digits_splits["train"], 3, seed=3)
    model = batches[0][0].double()
    observations = [observe(model, x.double(), y) for _, x, y in batches]
    params = {"generator": copy.deepcopy(digits_generator).double(), "variant": variant,
              "latent_iterations": 8, "parameter_iterations": 4, "image_iterations": 8,
              "restarts": 2, "seed": 7, "bn": 1.0,  # R_BN weighed to matter at 1e-8
              "stopper": stopper}
    stacked, looped, difference = stacked_and_looped("gias", params, observations)
    print(f"GIAS {variant} (stopper {stopper}), stacked vs loop: max pixel difference "
          f"{difference:.3g}, iterations {[r.extra['iterations'] for r in stacked]}")
    assert all(r.extra["vectorised_problems"] == 6 for r in stacked)
    assert difference <= 1e-8
    for a, b in zip(stacked, looped):
        assert (a.restart, a.iterations, a.extra["iterations"], a.stop_reason) == (
            b.restart, b.iterations, b.extra["iterations"], b.stop_reason)
        assert np.allclose(a.loss_trace, b.loss_trace, rtol=1e-8)
    assert attacks.build("gias", **{**params, "sparsity": 0.5}).forms_gradients
