"""Mode switches that restore the previous state: train/eval, parameters frozen."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(*modules: nn.Module) -> Iterator[None]:
    """Put ``modules`` in eval mode inside the block; give each its previous mode back."""
    before = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, training in zip(modules, before):
            m.train(training)


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """``module``'s parameters without ``requires_grad`` inside the block (a pass that
    differentiates its input only then keeps no graph for them); restored after."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)
