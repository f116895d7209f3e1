import pytest
import torch
from conftest import lenet_victims

from gradleak import attacks, defenses
from gradleak.attacks import Stopper
from gradleak.attacks.early_stopping import stop_point

T, P = 1e-5, 15  # the schema's defaults (EPAFL's MNIST setting)


def feed(stopper, losses):
    for i, loss in enumerate(losses, 1):
        if (why := stopper.update(loss)) is not None:
            return i, why
    return len(losses), None


def test_threshold_stops_below_t():
    losses = [1, 0.1, 1e-2, 5e-4, 1e-5]
    assert feed(Stopper("threshold", threshold=1e-3, patience=P), losses) == (4, "threshold")


def test_plateau_stops_after_patience_without_improvement():
    # Alg. 2: wait counts iterations whose loss is not below the best so far.
    stopper = Stopper("plateau", threshold=T, patience=3)
    assert feed(stopper, [5, 4, 4, 4.5, 4.2, 1]) == (5, "plateau")
    assert feed(Stopper("plateau", threshold=T, patience=3), [5, 4, 4, 3, 3, 2]) == (6, None)


def test_plateau_ignores_the_threshold_and_threshold_ignores_plateaus():
    assert feed(Stopper("plateau", threshold=1.0, patience=50), [0.5, 0.1]) == (2, None)
    assert feed(Stopper("threshold", threshold=1e-9, patience=1), [1, 1, 1]) == (3, None)


def test_hybrid_stops_on_either_condition():
    assert feed(Stopper("hybrid", threshold=1e-3, patience=2), [1, 1e-4]) == (2, "threshold")
    assert feed(Stopper("hybrid", threshold=1e-3, patience=2), [1, 2, 2]) == (3, "plateau")


def test_reset_forgets_the_history():
    stopper = Stopper("plateau", threshold=T, patience=2)
    feed(stopper, [1, 2])
    stopper.reset()
    assert stopper.update(3) is None


def test_a_minimum_relative_improvement_counts_a_creeping_loss_as_a_plateau():
    creeping = [1.0, 0.9999, 0.9998, 0.9997, 0.9996]  # -0.01 % a step
    assert feed(Stopper("plateau", threshold=T, patience=3), creeping) == (5, None)
    relative = Stopper("plateau", threshold=T, patience=3, min_improvement=1e-3)
    assert feed(relative, creeping) == (4, "plateau")
    assert feed(Stopper("plateau", threshold=T, patience=3, min_improvement=1e-3),
                [1.0, 0.5, 0.2, 0.1, 0.05]) == (5, None)  # halving: a new best every time


@pytest.mark.slow
def test_stop_point_on_a_full_run_is_where_a_live_stopper_stops(digits):
    """L-BFGS on one problem runs the same up to where a stopper stops it: the stop read
    from a run without one (benchmarks/epafl_readings.py) is the live stop, image and all."""
    model, x, y = lenet_victims(digits, 1, seed=3)[0]
    gradient = defenses.build("none")(defenses.DefenseContext(model=model, x=x, y=y))
    observation = attacks.Observation(model=model, gradient=gradient, batch_size=1)
    full = attacks.build("idlg", iterations=60)(observation, snapshots=range(61))
    for spec in ({"kind": "hybrid", "threshold": 1e-4, "patience": 5},
                 {"kind": "plateau", "threshold": T, "patience": 3, "min_improvement": 0.05}):
        live = attacks.build("idlg", iterations=60, stopper=spec)(observation)
        at, why = stop_point(Stopper(**spec), full.loss_trace)
        assert (live.iterations, live.stop_reason) == (at, why) and at < 60
        assert torch.equal(live.images, full.snapshots[at])


@pytest.mark.parametrize("kwargs", [{"kind": "early"}, {"patience": 0}, {"threshold": -1},
                                    {"min_improvement": 1.0}])
def test_bad_stopper_settings_fail(kwargs):
    with pytest.raises(ValueError):
        Stopper(**{"kind": "hybrid", "threshold": T, "patience": P, **kwargs})
