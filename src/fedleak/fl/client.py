"""Client-side computation: the gradient of the cross-entropy loss on one batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

Update = dict[str, torch.Tensor]


def gradient(model: nn.Module, x: torch.Tensor, target: torch.Tensor,
             create_graph: bool = False) -> Update:
    """d CE(model(x), target) / d params, keyed like ``model.named_parameters()``.

    ``target`` is either class indices (B,) or class probabilities (B, classes).
    """
    names, params = zip(*model.named_parameters())
    loss = F.cross_entropy(model(x), target)
    grads = torch.autograd.grad(loss, params, create_graph=create_graph)
    return dict(zip(names, grads))


def batch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))

