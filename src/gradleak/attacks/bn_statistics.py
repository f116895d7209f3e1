"""BatchNorm input statistics and GradInversion's R_BN between them (Yin et al., CVPR
2021, §3.3; GIAS §4 uses the same term).

For every BatchNorm layer, in ``model.modules()`` order, the per-channel mean
and biased variance of the layer's input over the batch (and spatial positions),
as BatchNorm computes them in train mode. The same forward hooks give the
client's statistics (BN_exact), the statistics of public images (BN_proxy) and
the trial batch's statistics inside the attack's objective, so the three are
comparable entry by entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

Statistics = list[tuple[torch.Tensor, torch.Tensor]]


def batchnorm_layers(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm)]


def checked(stats: Statistics | None, model: nn.Module, source: str) -> Statistics:
    """``stats``, detached on the model's device, when they hold one (mean, var) pair per
    BatchNorm layer of ``model``; else a ValueError naming ``source`` and what it expected."""
    if stats is None:
        raise ValueError(f"{source} needs obs.bn_statistics (the client's batch statistics, "
                         f"BN_exact), got None")
    layers = batchnorm_layers(model)
    if not layers:
        raise ValueError(f"{source} needs a model with BatchNorm layers; "
                         f"{type(model).__name__} has none")
    shapes = [((layer.num_features,),) * 2 for layer in layers]
    got = [(tuple(mean.shape), tuple(var.shape)) for mean, var in stats]
    if got != shapes:
        raise ValueError(f"{source}: expected {len(layers)} (mean, var) pairs, one per BatchNorm "
                         f"layer, of shapes {[s for s, _ in shapes]}; got {len(stats)}: {got}")
    device = next(model.parameters()).device
    return [(mean.detach().to(device), var.detach().to(device)) for mean, var in stats]


def bn_loss(trial: Statistics, target: Statistics, first_weight: float) -> torch.Tensor:
    """sum_l w_l (||mu_l - mu'_l||_2 + ||var_l - var'_l||_2), w_1 = ``first_weight``, else 1;
    per problem for statistics stacked on leading dimensions ((P, C): a (P,) loss)."""
    terms = [torch.linalg.vector_norm(m - tm, dim=-1) + torch.linalg.vector_norm(v - tv, dim=-1)
             for (m, v), (tm, tv) in zip(trial, target)]
    return first_weight * terms[0] + sum(terms[1:])


def stacked_statistics(targets: list[Statistics], restarts: int) -> Statistics:
    """The victims' per-layer (mean, var) as (V * restarts, C), victim-major: the targets
    of their stacked problems."""
    return [tuple(torch.stack([stats[layer][i] for stats in targets])
                  .repeat_interleave(restarts, dim=0) for i in range(2))
            for layer in range(len(targets[0]))]


def _moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance over every dimension but the channel (dim 1)."""
    dims = [d for d in range(x.ndim) if d != 1]
    return x.mean(dims), x.var(dims, unbiased=False)


class BNRecorder:
    """Forward hooks that record each BatchNorm layer's input moments (graph kept).

    Use as a context manager; :meth:`statistics` returns the moments of the last
    forward pass in ``model.modules()`` order.
    """

    def __init__(self, model: nn.Module) -> None:
        self.layers = batchnorm_layers(model)
        self._seen: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles: list = []

    def _hook(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], _) -> None:
        self._seen[module] = _moments(inputs[0])

    def __enter__(self) -> BNRecorder:
        self._handles = [layer.register_forward_hook(self._hook) for layer in self.layers]
        return self

    def __exit__(self, *_) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def statistics(self) -> Statistics:
        missing = [i for i, layer in enumerate(self.layers) if layer not in self._seen]
        if missing:
            raise RuntimeError(f"BatchNorm layers {missing} did not run in the last forward pass")
        stats = [self._seen[layer] for layer in self.layers]
        self._seen = {}
        return stats


@contextmanager
def preserved_buffers(model: nn.Module) -> Iterator[None]:
    """Restore the model's buffers (BN running statistics, counters) on exit."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(saved[name])


def batch_statistics(model: nn.Module, x: torch.Tensor) -> Statistics:
    """The (mean, var) of every BatchNorm input for the batch ``x`` (BN_exact).

    The model runs in its current mode (train mode, as the client computes its
    gradient); its running statistics are left unchanged.
    """
    with torch.no_grad(), preserved_buffers(model), BNRecorder(model) as recorder:
        model(x)
        return recorder.statistics()


def dataset_statistics(model: nn.Module, images: torch.Tensor, chunk: int = 256) -> Statistics:
    """The (mean, var) of every BatchNorm input over all ``images`` (BN_proxy).

    ``images`` (public data) pass through the model ``chunk`` at a time; the
    per-chunk moments are pooled exactly (each chunk weighted by its size). In
    train mode a layer's input depends on the statistics of the chunk it runs
    with, so the proxy is exact for ``chunk >= len(images)``.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if len(images) == 0:
        raise ValueError("dataset_statistics needs at least one image, got none")
    sums: list[list[torch.Tensor]] | None = None
    for start in range(0, len(images), chunk):
        part = images[start:start + chunk]
        weight = len(part) / len(images)
        stats = batch_statistics(model, part)
        terms = [[weight * mean, weight * (var + mean**2)] for mean, var in stats]
        sums = terms if sums is None else [[a + c, b + d] for (a, b), (c, d) in zip(sums, terms)]
    return [(mean, second - mean**2) for mean, second in sums]
