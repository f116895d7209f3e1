"""Utility metrics: accuracy and Refiner's performance-maintenance metric (PMM, §5.3)."""

from __future__ import annotations

import torch
from torch import nn


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            logits = model(x[start:start + batch_size])
            correct += int((logits.argmax(1) == y[start:start + batch_size]).sum())
    return correct / len(x)


def pmm(defense_accuracy: float, original_accuracy: float) -> float:
    """PMM = defense_acc / original_acc x 100 (Refiner §5.3)."""
    if original_accuracy <= 0:
        raise ValueError(f"original accuracy must be > 0 to compute PMM, got {original_accuracy}")
    return 100.0 * defense_accuracy / original_accuracy
