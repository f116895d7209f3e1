"""Utility metrics: accuracy and test loss (Refiner's PMM of them: ``metrics.maintenance``)."""

from __future__ import annotations

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
