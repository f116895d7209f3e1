"""Utility metrics: accuracy and Refiner's performance-maintenance metric (PMM, §5.3)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedleak.utils.modes import eval_mode


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on (x, y), in eval mode (the model's mode is restored)."""
    correct = 0
    with eval_mode(model), torch.no_grad():
        for start in range(0, len(x), batch_size):
            logits = model(x[start:start + batch_size])
            correct += int((logits.argmax(1) == y[start:start + batch_size]).sum())
    return correct / len(x)


def pmm(defense_accuracy, original_accuracy):
    """PMM = defense_acc / original_acc x 100 (Refiner §5.3); numbers, arrays or Series.

    A missing (NaN) original accuracy gives NaN; a non-positive one is an error.
    """
    if np.any(np.asarray(original_accuracy, dtype=float) <= 0):
        raise ValueError(f"original accuracy must be > 0 to compute PMM, got {original_accuracy}")
    return 100.0 * defense_accuracy / original_accuracy
