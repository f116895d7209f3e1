"""Refiner's performance-maintenance metric (PMM, §5.3), torch-free: the tables read it."""

from __future__ import annotations

import numpy as np


def pmm(defense_accuracy, original_accuracy):
    """PMM = defense_acc / original_acc x 100 (Refiner §5.3); numbers, arrays or Series.

    A missing (NaN) original accuracy gives NaN; a non-positive one is an error.
    """
    if np.any(np.asarray(original_accuracy, dtype=float) <= 0):
        raise ValueError(f"original accuracy must be > 0 to compute PMM, got {original_accuracy}")
    return 100.0 * defense_accuracy / original_accuracy
