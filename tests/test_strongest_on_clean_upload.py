"""The strongest attacker on the clean upload is the strongest of all (issue 74, decision
0107): an adaptive attacker changes the objective, not the information, so every objective
an adaptive form uses and the clean upload allows is run against ``none`` too: clipping's
per-layer normalisation (``distance: layer_cosine``) and clipping itself, which the attacker
applies to the upload (``eot`` with ``applies``). Per attack family, on the embedded
default's victims (single 16x16 digits, Sigmoid LeNet) at its budget (200 iterations), no
defense's strongest attacker recovers more than the undefended one's beyond the 95 %
interval of their paired difference over the victims."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import default_victims

from gradleak import attacks, defenses, metrics
from gradleak.report.intervals import interval
from gradleak.types import DefenseContext, Observation

VICTIMS = 5
BUDGET = {"inverting_gradients": {"iterations": 200}, "rog": {},
          "fan2025": {"iterations": 200, "channels": 32, "median_filter": 1}}
CLIPPED = {"defense": "clipping", "params": {"bound": 1.0}}
# each family's objectives on the clean upload: the attack as the paper states it, the
# per-layer normalisation and clipping applied by the attacker (the embedded default's)
ON_CLEAN = {"inverting_gradients": [("inverting_gradients", {}),
                                    ("inverting_gradients", {"distance": "layer_cosine"}),
                                    ("eot", {"applies": CLIPPED})],
            "rog": [("rog", {})], "fan2025": [("fan2025", {})]}
# the two defenses whose adaptive attackers recovered more than any attacker on the clean
# upload in the embedded default (Inverting Gradients 57.2 and 53.1 against 39.8 dB)
DEFENDED = {"clipping": {"bound": 1.0}, "soteria": {"ratio": 0.9}}


@pytest.fixture(scope="module")
def victims(digits_splits):
    return default_victims(digits_splits, VICTIMS, seed=5)


def _psnr(attack, observations, victims) -> np.ndarray:
    return np.array([float(metrics.psnr(attack(obs).images.clamp(0, 1), x))
                     for obs, (_, x, _) in zip(observations, victims)])


def _strongest(runs: list[np.ndarray]) -> np.ndarray:
    """The attacker of the highest mean PSNR, as the matched-utility table takes it."""
    return max(runs, key=np.mean)


def _uploads(victims, defense) -> list[Observation]:
    return [Observation(model=model, gradient=defense(DefenseContext(
        model, x, y, torch.Generator().manual_seed(i))), batch_size=len(x))
        for i, (model, x, y) in enumerate(victims)]


@pytest.fixture(scope="module")
def clean(victims):
    """Each family's runs on the undefended uploads, by objective."""
    uploads = _uploads(victims, defenses.build("none"))
    return {family: [_psnr(_build(family, name, variant), uploads, victims)
                     for name, variant in variants] for family, variants in ON_CLEAN.items()}


def _build(family: str, name: str, params: dict):
    if name == "eot":
        return attacks.build("eot", wraps=family, wraps_params=BUDGET[family], samples=1,
                             **params)
    return attacks.build(name, **BUDGET[name], **params)


def test_applying_clipping_to_the_clean_upload_is_the_adaptive_attack_on_clipping(victims):
    """Clipping is a function of the gradient alone: the attacker that clips the clean
    upload itself recovers what the adaptive attacker recovers from the clipped upload."""
    clipping = defenses.build("clipping", **CLIPPED["params"])
    ig = {"iterations": 5}
    applied = attacks.build("eot", wraps="inverting_gradients", wraps_params=ig, samples=1,
                            applies=CLIPPED)
    adaptive = attacks.build("eot", wraps="inverting_gradients", wraps_params=ig, samples=1,
                             defense=clipping)
    clean, clipped = (_uploads(victims[:2], d) for d in (defenses.build("none"), clipping))
    for on_clean, on_clipped in zip(clean, clipped):
        a, b = applied(on_clean), adaptive(on_clipped)
        assert torch.allclose(a.images, b.images, atol=1e-6)
        assert a.extra["eot_defense"] == "clipping"


def test_applies_names_a_defense_of_the_gradient_alone():
    """Soteria's pruned columns depend on the client's batch, which the attacker lacks."""
    with pytest.raises(ValueError, match=r"'soteria' is not one of \['clipping'\]"):
        attacks.build("eot", wraps="inverting_gradients", samples=1,
                      applies={"defense": "soteria", "params": {"ratio": 0.5}})


@pytest.mark.slow
@pytest.mark.xdist_group("clean_upload")  # one worker makes `clean` (a minute) for all
@pytest.mark.parametrize("family", sorted(ON_CLEAN))
@pytest.mark.parametrize("name", sorted(DEFENDED))
def test_no_defense_leaks_more_than_the_clean_upload(victims, clean, family, name):
    defense = defenses.build(name, **DEFENDED[name])
    uploads = _uploads(victims, defense)
    paper = _psnr(attacks.build(family, **BUDGET[family]), uploads, victims)
    adaptive = _psnr(attacks.build("eot", wraps=family, wraps_params=BUDGET[family],
                                   defense=defense, samples=1), uploads, victims)
    excess = _strongest([paper, adaptive]) - _strongest(clean[family])
    low, high = interval(excess)
    print(family, name, "defended", paper.mean().round(2), adaptive.mean().round(2),
          "clean", [run.mean().round(2) for run in clean[family]],
          "excess", excess.round(2).tolist(), (low, high))
    # the attacker's own clipping of the clean upload is the adaptive attack on clipping's
    # upload, victim by victim: no interval, equal
    assert (low <= 0) if np.isfinite(low) else max(excess) <= 1e-6


@pytest.mark.slow
@pytest.mark.xdist_group("clean_upload")
def test_without_the_per_layer_objective_clipping_leaks_more(victims, clean):
    """The finding that asked for it: Inverting Gradients' cosine over all layers on the
    clean upload recovers less than its adaptive form through clipping at bound 1."""
    defense = defenses.build("clipping", **DEFENDED["clipping"])
    ig = BUDGET["inverting_gradients"]
    adaptive = _psnr(attacks.build("eot", wraps="inverting_gradients", wraps_params=ig,
                                   defense=defense, samples=1), _uploads(victims, defense),
                     victims)
    low, _ = interval(adaptive - clean["inverting_gradients"][0])
    print("clipping 1 adaptive", adaptive.round(2).tolist(), "clean cosine",
          clean["inverting_gradients"][0].round(2).tolist(), "low", low)
    assert low > 0
