"""A defense's measure at another setting's learning loss (Cui et al., RecUP-FL §6.1-6.2:
defenses compared "at the same learning loss"): its (learning loss, measure) curve over its
strengths, starting from the undefended run, interpolated linearly at that loss; NaN where
the curve does not span it (no extrapolation)."""

from __future__ import annotations

import numpy as np


def at_loss(loss: float, losses, values) -> float:
    """``values`` interpolated at ``loss`` along the curve of ``losses`` (any order); NaN
    outside its span or on an empty curve."""
    x, y = np.asarray(losses, dtype=float), np.asarray(values, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if not len(x) or not x.min() <= loss <= x.max():
        return np.nan
    order = np.argsort(x, kind="stable")
    return float(np.interp(loss, x[order], y[order]))

