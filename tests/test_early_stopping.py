import pytest

from fedleak.attacks import Stopper

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


@pytest.mark.parametrize("kwargs", [{"kind": "early"}, {"patience": 0}, {"threshold": -1}])
def test_bad_stopper_settings_fail(kwargs):
    with pytest.raises(ValueError):
        Stopper(**{"kind": "hybrid", "threshold": T, "patience": P, **kwargs})
