"""A defense's measure at another setting's learning loss (Cui et al., RecUP-FL §6.1-6.2:
defenses compared "at the same learning loss"): its (learning loss, measure) curve over its
strengths, starting from the undefended run, interpolated linearly at that loss; NaN where
the curve does not span it (no extrapolation). With a tolerance (``at_loss_within``): RecUP-FL
§6.3 counts losses "within 1e-3" as "a similar level of learning loss", so the defense's
points that close count too, and the one least favourable to the claim is read."""

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



def at_loss_within(loss: float, losses, values, within: float, pick) -> float:
    """The value ``pick`` (``min`` or ``max``: the least favourable to the claim) chooses
    among ``at_loss``'s and those of the curve's points within ``within`` of ``loss``; NaN
    where there are none."""
    x, y = np.asarray(losses, dtype=float), np.asarray(values, dtype=float)
    near = [float(v) for v in y[np.isfinite(y) & (np.abs(x - loss) <= within)]]
    found = [v for v in (at_loss(loss, x, y), *near) if np.isfinite(v)]
    return pick(found) if found else np.nan
