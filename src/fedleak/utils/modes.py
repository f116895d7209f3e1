"""Train/eval mode switches that restore the previous mode."""

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
