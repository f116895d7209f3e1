"""Refiner's performance-maintenance metric (PMM, §5.3), torch-free: the tables read it."""

from __future__ import annotations

import numpy as np
import pandas as pd


def pmm(defense_accuracy, original_accuracy):
    """PMM = defense_acc / original_acc x 100 (Refiner §5.3); numbers, arrays or Series.

    A missing (NaN) or zero original accuracy gives NaN: an undefended run that classifies
    nothing right (GIAS's one-round FL on 1,000 classes) has no performance to maintain.
    """
    original = np.asarray(original_accuracy, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = 100.0 * np.asarray(defense_accuracy, dtype=float) / np.where(
            original > 0, original, np.nan)
    if isinstance(defense_accuracy, pd.Series):
        return pd.Series(ratio, index=defense_accuracy.index)
    return ratio if ratio.ndim else float(ratio)
