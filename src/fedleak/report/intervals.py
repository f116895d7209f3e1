"""95 % percentile bootstrap intervals of a statistic over victims, and over FL seeds where
there are several (issue 46).

With one seed the resamples draw the victims with replacement (Efron and Tibshirani, *An
Introduction to the Bootstrap*, 1993, §13.3, the percentile interval; what
``scipy.stats.bootstrap(method="percentile")`` gives). With several seeds they are
two-stage (Davison and Hinkley, *Bootstrap Methods and their Application*, 1997, §3.8,
the cluster bootstrap): the seeds drawn with replacement, then each drawn seed's victims,
since victims of one FL run share its model. Units whose value is missing (NaN: a failed
victim, or one that a statistic over the successes leaves out) are drawn like any other
and skipped by the statistic, as the tables' means skip them.

A rate (``asr``: the share of successes) is resampled with one success and one failure
added to every seed's victims (Agresti and Caffo, "Simple and effective confidence intervals for
proportions and differences of proportions result from adding two successes and two
failures", *The American Statistician* 54(4), 2000), so that 0 successes of 8 victims does
not give a zero-width interval; the rate itself is the victims' own.

Fewer than two units give no interval (NaN), and so do units that all measured the same
(every resample gives one value: a bootstrap cannot tell that from a spread it did not
see). A percentile interval from a handful of victims is too narrow rather than too wide;
the resamples come from a fixed seed, so the same numbers give the same bytes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
# a statistic of the tables (report.targets.STATISTICS) over the rows of each resample,
# skipping NaN
STATISTICS: dict[str, Callable] = {"mean": np.nanmean, "sum": np.nansum, "max": np.nanmax,
                                   "min": np.nanmin, "median": np.nanmedian,
                                   "sd": np.nanstd, "asr": np.nanmean}


def replicates(values, groups=None, statistic: str = "mean", resamples: int = RESAMPLES,
               seed: int = SEED) -> np.ndarray:
    """The ``statistic`` of each of ``resamples`` bootstrap resamples of ``values``
    (``groups``: each value's seed, resampled first where there are several)."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return np.full(resamples, np.nan)
    labels = np.zeros(len(values), dtype=int) if groups is None else \
        np.unique(np.asarray(groups), return_inverse=True)[1]
    if statistic == "asr":  # Agresti and Caffo's success and failure, in every seed's victims
        seeds = np.unique(labels)
        values = np.concatenate([values, np.tile([1.0, 0.0], len(seeds))])
        labels = np.concatenate([labels, np.repeat(seeds, 2)])
    sizes = np.bincount(labels)
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rng = np.random.default_rng(seed)
    clusters = rng.integers(0, len(sizes), (resamples, len(sizes))) if len(sizes) > 1 \
        else np.zeros((resamples, 1), dtype=int)
    drawn = sizes[clusters][..., None]                         # victims of each drawn seed
    within = np.floor(rng.random((*clusters.shape, sizes.max())) * drawn).astype(int)
    sample = values[order[starts[clusters][..., None] + within]]
    sample[np.arange(sizes.max()) >= drawn] = np.nan            # a smaller seed's padding
    with warnings.catch_warnings():  # a resample of NaN only: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return STATISTICS[statistic](sample.reshape(resamples, -1), axis=1)


def bounds(draws: np.ndarray, units: int) -> tuple[float, float]:
    """The percentile interval of bootstrap ``draws`` over ``units`` measured values (NaN,
    NaN with fewer than two, or where every draw is the same); a resample with nothing to
    measure (no success among its victims) is left out."""
    draws = np.asarray(draws, dtype=float)
    draws = draws[~np.isnan(draws)]
    if units < 2 or not len(draws) or np.ptp(draws) == 0:
        return np.nan, np.nan
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def interval(values, groups=None, statistic: str = "mean") -> tuple[float, float]:
    """The 95 % interval of ``statistic`` over ``values`` (see the module docstring)."""
    values = np.asarray(values, dtype=float)
    return bounds(replicates(values, groups, statistic), int((~np.isnan(values)).sum()))
