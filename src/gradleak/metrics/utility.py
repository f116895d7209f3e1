"""Utility metrics: accuracy and Refiner's performance-maintenance metric (PMM, §5.3)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gradleak.utils.modes import eval_mode


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512
             ) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy (the test loss of CENSOR Fig. 8 and RecUP-FL's
    learning loss) of ``model`` on (x, y), in eval mode (the model's mode is restored)."""
    correct, total_loss = 0, 0.0
    with eval_mode(model), torch.no_grad():
        for start in range(0, len(x), batch_size):
            logits = model(x[start:start + batch_size])
            target = y[start:start + batch_size]
            correct += int((logits.argmax(1) == target).sum())
            total_loss += float(F.cross_entropy(logits, target, reduction="sum"))
    return {"accuracy": correct / len(x), "test_loss": total_loss / len(x)}


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on (x, y), in eval mode (the model's mode is restored)."""
    return evaluate(model, x, y, batch_size)["accuracy"]


def pmm(defense_accuracy, original_accuracy):
    """PMM = defense_acc / original_acc x 100 (Refiner §5.3); numbers, arrays or Series.

    A missing (NaN) original accuracy gives NaN; a non-positive one is an error.
    """
    if np.any(np.asarray(original_accuracy, dtype=float) <= 0):
        raise ValueError(f"original accuracy must be > 0 to compute PMM, got {original_accuracy}")
    return 100.0 * defense_accuracy / original_accuracy
