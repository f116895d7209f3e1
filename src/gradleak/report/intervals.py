"""95 % intervals that keep their coverage at 8-16 units (decision 0105): of a mean, of a
rate, and of a difference or ratio of two, paired or not. The one place intervals are made.

**Units.** The values handed in are independent units: the victims of one FL run, or the
FL runs themselves (one value per seed). Where a quantity's victims come from several FL
runs, the caller hands each run's mean (``cluster_means``): victims of one run share its
model, so the run is the unit that repeats (Davison and Hinkley, *Bootstrap Methods and
their Application*, 1997, §3.8).

**Means** (any metric but a rate): the studentized bootstrap (bootstrap-t; Efron and
Tibshirani, *An Introduction to the Bootstrap*, 1993, §12.5; Davison and Hinkley §5.2.1)
from ``RESAMPLES`` resamples, each studentized by its own standard error: s/sqrt(n) for a
mean, sqrt(s_a^2/n_a + s_b^2/n_b) for an unpaired difference, the per-unit differences'
for a paired one, and for a ratio of positive means the delta method's on the log scale
(paired: from the units' log-linearised values a_i/m_a - b_i/m_b). At 8 and 16 units it
covers 93-97 % of normal and log-normal draws where the percentile and BCa intervals cover
84-91 % (``tests/test_claims.py`` simulates it). With 2-5 units a bootstrap has too few
distinct resamples: Student's t on the same standard error (Welch's degrees of freedom for
two unpaired sides).

**Rates** (a share of successes, 0/1 per unit): Wilson's score interval for one rate, and
for a difference Newcombe's hybrid score interval (his method 10: the two Wilson intervals
combined, with the paired 2x2 table's correlation where both sides are the same units;
*Statistics in Medicine* 17, 1998, 873-890 and 2635-2650): 0 successes of 8 is not a
certain zero, and at 16 units it covers 93-96 % where Agresti and Min's paired interval
covers 89-97 %.

No interval (NaN) from fewer than two units or from units that all measured the same (no
spread seen). The resamples come from a fixed seed: the same numbers give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.stats

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
FEW = 6  # below this many units: Student's t instead of the bootstrap
Z = float(scipy.stats.norm.ppf(0.5 + LEVEL / 2))


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    method: str  # how it was made ("bootstrap-t", "t", "agresti-caffo", ...; "" for none)

    @classmethod
    def none(cls, estimate: float = np.nan) -> Interval:
        return cls(float(estimate), np.nan, np.nan, "")


def cluster_means(values, groups) -> np.ndarray:
    """The units of ``values`` grouped by FL run (``groups``): each group's mean (NaN values
    skipped), or the values themselves where there is one group."""
    values = np.asarray(values, dtype=float)
    labels = np.unique(np.asarray(groups), return_inverse=True)[1]
    if labels.max(initial=0) == 0:
        return values[np.isfinite(values)]
    means = np.array([np.nanmean(values[labels == g]) if np.isfinite(values[labels == g]).any()
                      else np.nan for g in range(labels.max() + 1)])
    return means[np.isfinite(means)]


def _studentized(estimate: float, se: float, replicate_t: np.ndarray, df: float
                 ) -> tuple[float, float, str]:
    """The interval from the bootstrap-t replicates (or, with none, Student's t on ``df``)."""
    if replicate_t is None:
        q = float(scipy.stats.t.ppf(0.5 + LEVEL / 2, df))
        return estimate - q * se, estimate + q * se, "t"
    finite = replicate_t[np.isfinite(replicate_t)]
    upper, lower = np.quantile(finite, [0.5 + LEVEL / 2, 0.5 - LEVEL / 2])
    return estimate - upper * se, estimate - lower * se, "bootstrap-t"


def _draws(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, n, (RESAMPLES, n))


def _sd(x: np.ndarray) -> np.ndarray:
    return x.std(axis=-1, ddof=1)


def mean(values) -> Interval:
    """The mean of independent units with its studentized interval."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n < 2:
        return Interval.none(x.mean() if n else np.nan)
    m, se = float(x.mean()), float(x.std(ddof=1) / np.sqrt(n))
    if se == 0:
        return Interval.none(m)
    t = None
    if n >= FEW:
        s = x[_draws(n, np.random.default_rng(SEED))]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (s.mean(-1) - m) / (_sd(s) / np.sqrt(n))
    return Interval(m, *_studentized(m, se, t, n - 1))


def _paired_log_ratio(a: np.ndarray, b: np.ndarray) -> Interval:
    n = len(a)
    ma, mb = a.mean(), b.mean()
    theta = float(np.log(ma / mb))
    se = float(_sd(a / ma - b / mb) / np.sqrt(n))
    if se == 0:
        return Interval.none(np.exp(theta))
    t = None
    if n >= FEW:
        idx = _draws(n, np.random.default_rng(SEED))
        sa, sb = a[idx], b[idx]
        msa, msb = sa.mean(-1), sb.mean(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ses = _sd(sa / msa[:, None] - sb / msb[:, None]) / np.sqrt(n)
            t = (np.log(msa / msb) - theta) / ses
    low, high, method = _studentized(theta, se, t, n - 1)
    return Interval(float(np.exp(theta)), float(np.exp(low)), float(np.exp(high)), method)


def _unpaired(a: np.ndarray, b: np.ndarray, ratio: bool) -> Interval:
    na, nb = len(a), len(b)
    ma, mb, va, vb = a.mean(), b.mean(), a.var(ddof=1) / na, b.var(ddof=1) / nb
    if ratio:  # log(ma / mb), delta method: var(log m) = var(m) / m^2
        theta, se = float(np.log(ma / mb)), float(np.sqrt(va / ma ** 2 + vb / mb ** 2))
    else:
        theta, se = float(ma - mb), float(np.sqrt(va + vb))
    if se == 0:
        return Interval.none(np.exp(theta) if ratio else theta)
    t = None
    if min(na, nb) >= FEW:
        rng = np.random.default_rng(SEED)
        sa, sb = a[_draws(na, rng)], b[_draws(nb, rng)]
        msa, msb = sa.mean(-1), sb.mean(-1)
        vsa, vsb = _sd(sa) ** 2 / na, _sd(sb) ** 2 / nb
        with np.errstate(divide="ignore", invalid="ignore"):
            if ratio:
                t = (np.log(msa / msb) - theta) / np.sqrt(vsa / msa ** 2 + vsb / msb ** 2)
            else:
                t = (msa - msb - theta) / np.sqrt(vsa + vsb)
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)) if not ratio else \
        min(na, nb) - 1  # Welch-Satterthwaite
    low, high, method = _studentized(theta, se, t, df)
    if ratio:
        return Interval(float(np.exp(theta)), float(np.exp(low)), float(np.exp(high)), method)
    return Interval(theta, low, high, method)


def _measured(a, b, paired: bool) -> tuple[np.ndarray, np.ndarray]:
    """The finite values of two sides (paired: the units both sides measured)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if paired:
        keep = np.isfinite(a) & np.isfinite(b)
        return a[keep], b[keep]
    return a[np.isfinite(a)], b[np.isfinite(b)]


def contrast(a, b, by: str = "difference", paired: bool = False) -> Interval:
    """Mean of ``a`` minus (``by="ratio"``: over) mean of ``b`` with its studentized
    interval; ``paired``: a[i] and b[i] are one unit's two values."""
    a, b = _measured(a, b, paired)
    if min(len(a), len(b)) < 2:
        return Interval.none()
    ratio = by == "ratio"
    if ratio and (a.mean() <= 0 or b.mean() <= 0):
        return Interval.none(a.mean() / b.mean() if b.mean() else np.nan)
    if paired and ratio:
        return _paired_log_ratio(a, b)
    if paired:
        return mean(a - b)
    return _unpaired(a, b, ratio)


def _wilson(successes: float, n: int) -> tuple[float, float]:
    """Wilson's score interval of a rate of ``successes`` in ``n``."""
    p = successes / n
    centre, half = p + Z ** 2 / (2 * n), Z * np.sqrt(p * (1 - p) / n + Z ** 2 / (4 * n * n))
    return (centre - half) / (1 + Z ** 2 / n), (centre + half) / (1 + Z ** 2 / n)


def pooled_rate(rates, counts) -> Interval:
    """Rates measured on ``counts`` trials each (an adversary's ASR per round on its test
    uploads), pooled: the share of the pooled successes with its Wilson interval. The
    rounds of one job share their test samples, so the interval is somewhat too narrow;
    without the counts (older records), the mean of the rates alone."""
    r, n = np.asarray(rates, dtype=float), np.asarray(counts, dtype=float)
    keep = np.isfinite(r) & np.isfinite(n) & (n > 0)
    if not keep.all() or not keep.any():
        return Interval.none(float(np.nanmean(r)) if np.isfinite(r).any() else np.nan)
    successes, total = float((r * n).sum()), int(n.sum())
    return Interval(successes / total, *_wilson(successes, total), "wilson, pooled")


def rate(successes) -> Interval:
    """A share of successes (0/1 units) with Wilson's interval."""
    x = np.asarray(successes, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return Interval.none(x.mean() if len(x) else np.nan)
    return Interval(float(x.mean()), *_wilson(x.sum(), len(x)), "wilson")


def rate_difference(a, b, paired: bool = False) -> Interval:
    """Rate of ``a`` minus rate of ``b`` with Newcombe's hybrid score interval (his method
    10, with the paired table's correlation where ``paired``)."""
    a, b = _measured(a, b, paired)
    if min(len(a), len(b)) < 2:
        return Interval.none()
    pa, pb = a.mean(), b.mean()
    (la, ua), (lb, ub) = _wilson(a.sum(), len(a)), _wilson(b.sum(), len(b))
    phi = 0.0
    if paired:  # the 2x2 table's phi coefficient, floored at 0 (Newcombe's choice)
        both, only_a = ((a == 1) & (b == 1)).sum(), ((a == 1) & (b == 0)).sum()
        only_b, neither = ((a == 0) & (b == 1)).sum(), ((a == 0) & (b == 0)).sum()
        margins = float((both + only_a) * (only_b + neither) * (both + only_b)
                        * (only_a + neither))
        phi = max(0.0, (both * neither - only_a * only_b) / np.sqrt(margins)) if margins else 0.0
    down = np.sqrt(max((pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2, 0.0))
    up = np.sqrt(max((ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2, 0.0))
    d = float(pa - pb)
    return Interval(d, d - down, d + up, "newcombe-paired" if paired else "newcombe")


def interval(values, groups=None, statistic: str = "mean") -> tuple[float, float]:
    """The 95 % interval of the mean (``statistic="asr"``: the rate) over ``values``, the
    units being each FL run's mean where ``groups`` names several (the tables' columns)."""
    if statistic not in ("mean", "asr"):
        raise ValueError(f"an interval is of a mean or a rate; got statistic {statistic!r}")
    values = np.asarray(values, dtype=float)
    several = groups is not None and len(np.unique(np.asarray(groups))) > 1
    if several:
        made = mean(cluster_means(values, groups))
    else:
        made = (rate if statistic == "asr" else mean)(values)
    return made.low, made.high
