"""Gradient features for attribute inference (RecUP-FL §5.4, after Melis et al. 2019).

An update (all its tensors in insertion order, flattened and concatenated into one
vector of D values) is reduced to a fixed ``size`` by adaptive max pooling
(``torch.nn.functional.adaptive_max_pool1d``): window i covers elements
[floor(i D / size), ceil((i + 1) D / size)). The pooling is differentiable, so a
defense can back-propagate a classifier's loss to the update tensors (the gradient
reaches the maximum of each window).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, replace_all_batch_norm_modules_, vmap


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"feature size must be an integer >= 1, got {size!r}")
    return size


def pool(flat: torch.Tensor, size: int) -> torch.Tensor:
    """(N, D) flattened updates -> (N, size) max-pooled features."""
    return F.adaptive_max_pool1d(flat.unsqueeze(1), _check_size(size)).squeeze(1)


def gradient_features(update: Mapping[str, torch.Tensor], size: int) -> torch.Tensor:
    """The update flattened (tensors in insertion order) and max-pooled to ``(size,)``."""
    if not update:
        raise ValueError("gradient_features needs an update with at least one tensor, got none")
    flat = torch.cat([t.reshape(-1) for t in update.values()])
    return pool(flat.unsqueeze(0), size)[0]


def per_sample_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor
                         ) -> dict[str, torch.Tensor]:
    """Parameter name -> (N, *shape): d CE(model(x_i), y_i) / d params for every sample i,
    keyed like ``model.named_parameters()`` (``Update.of`` on a batch of one), computed
    with ``torch.func`` (vmap of grad of ``functional_call``). In train mode, as clients
    compute their uploads: dropout draws a mask per sample and BatchNorm normalises with
    the sample's own statistics (on a copy of the model that tracks no running
    statistics, which vmap cannot update in place)."""
    if model.training and any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                              for m in model.modules()):
        model = replace_all_batch_norm_modules_(copy.deepcopy(model))
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(logits, yi.unsqueeze(0))

    return vmap(grad(loss), in_dims=(None, 0, 0), randomness="different")(params, x, y)


def features_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, size: int,
                chunk: int = 128) -> torch.Tensor:
    """(N, size) float tensor: ``gradient_features`` of each sample's own gradient,
    computed ``chunk`` samples at a time so memory stays bounded."""
    _check_size(size)
    if len(x) != len(y):
        raise ValueError(f"features_of needs one label per sample, got {len(x)} inputs and "
                         f"{len(y)} labels")
    out = []
    for start in range(0, len(x), chunk):
        grads = per_sample_gradients(model, x[start:start + chunk], y[start:start + chunk])
        flat = torch.cat([g.flatten(1) for g in grads.values()], dim=1)
        out.append(pool(flat, size).float())
    if not out:
        return torch.zeros(0, size)
    return torch.cat(out)
