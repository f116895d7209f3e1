"""Intervals that keep their coverage (decision 0105): simulated known distributions at 8
and 16 units, rates that are not certain from a few victims, paired against unpaired."""

from __future__ import annotations

import numpy as np
import pytest

from gradleak.report import intervals as iv

DRAWS = 2000  # simulated samples per case: a coverage estimate's standard error is 0.5 %

CASES = {
    "mean of normal units": (lambda g, n: (g.normal(20, 4, n),), 20.0, iv.mean),
    "mean of skewed units": (lambda g, n: (g.gamma(4, 1, n),), 4.0, iv.mean),
    "paired difference": (
        lambda g, n: (lambda x: (x + g.normal(2, 1, n), x + g.normal(0, 1, n)))(
            g.normal(0, 3, n)), 2.0, lambda a, b: iv.contrast(a, b, paired=True)),
    "unpaired difference": (lambda g, n: (g.gamma(4, 1, n), g.gamma(2, 1, n)), 2.0,
                            iv.contrast),
    "unpaired ratio": (lambda g, n: (g.gamma(4, 1, n), g.gamma(8, 1, n)), 0.5,
                       lambda a, b: iv.contrast(a, b, by="ratio")),
    "paired ratio": (  # E[b L] / E[b] = E[L] for a factor L drawn apart from b
        lambda g, n: (lambda b: (b * g.lognormal(-1, 0.2, n), b))(g.gamma(8, 1, n)),
        float(np.exp(-1 + 0.02)), lambda a, b: iv.contrast(a, b, by="ratio", paired=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("units", [8, 16])
def test_the_interval_covers_95_percent_at_8_and_16_units(case, units):
    draw, truth, interval = CASES[case]
    rng = np.random.default_rng(units)
    covered = [interval(*draw(rng, units)) for _ in range(DRAWS)]
    coverage = np.mean([c.low <= truth <= c.high for c in covered])
    assert 0.93 <= coverage <= 0.97, coverage
    assert {c.method for c in covered} == {"bootstrap-t"}


def test_the_percentile_bootstrap_would_not_cover_at_8_units():
    # what the studentized interval replaces: the percentile interval of 8 skewed units
    rng = np.random.default_rng(8)
    hits = 0
    for _ in range(400):
        x = rng.gamma(1, 1, 8)
        means = x[rng.integers(0, 8, (1000, 8))].mean(1)
        low, high = np.percentile(means, [2.5, 97.5])
        hits += low <= 1.0 <= high
    assert hits / 400 < 0.92


def test_few_units_get_student_s_t_and_one_unit_or_no_spread_none():
    made = iv.mean([10.0, 12.0, 11.0])
    assert made.method == "t" and made.low < 11 < made.high
    assert made.high - made.low == pytest.approx(2 * 4.303 * 1.0 / np.sqrt(3), rel=1e-3)
    assert np.isnan(iv.mean([12.0]).low) and np.isnan(iv.mean([12.0] * 6).low)
    assert iv.mean([12.0] * 6).estimate == 12.0


def test_a_rate_of_zero_or_one_is_not_certain():
    none = iv.rate(np.zeros(8))
    assert none.estimate == 0.0 and none.low == 0.0 and 0.25 < none.high < 0.4  # Wilson: 0.32
    every = iv.rate(np.ones(16))
    assert every.high == pytest.approx(1.0) and every.low < 0.85
    same = iv.rate_difference(np.ones(16), np.ones(16), paired=True)
    assert same.estimate == 0 and same.low < 0 < same.high


def test_paired_victims_give_a_narrower_interval_than_unpaired_ones():
    # the same 16 victims under two settings: each loses about 1 dB, victims differ by 10
    rng = np.random.default_rng(0)
    base = rng.normal(20, 5, 16)
    a, b = base - 1 + rng.normal(0, 0.3, 16), base
    paired, unpaired = iv.contrast(a, b, paired=True), iv.contrast(a, b)
    assert paired.high < 0 < unpaired.high  # only the paired comparison sees the loss
    assert paired.estimate == pytest.approx(unpaired.estimate)
    # and a rate difference on the same victims uses their 2x2 table
    wins = (rng.random(16) < 0.9).astype(float)
    assert iv.rate_difference(wins, wins * 0, paired=True).method == "newcombe-paired"


def test_the_tables_interval_is_of_the_runs_means_where_there_are_several():
    values = np.concatenate([np.full(10, 10.0), np.full(10, 14.0), np.full(10, 18.0)])
    values = values + np.tile(np.linspace(-0.5, 0.5, 10), 3)
    seeds = np.repeat([0, 1, 2], 10)
    pooled, clustered = iv.interval(values), iv.interval(values, seeds)
    assert clustered[1] - clustered[0] > 5 * (pooled[1] - pooled[0])  # 3 runs, t on 2 df
    with pytest.raises(ValueError, match="an interval is of a mean or a rate"):
        iv.interval(values, statistic="median")
    assert iv.interval(values) == iv.interval(values)  # a fixed seed: the same bytes
