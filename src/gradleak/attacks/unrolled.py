"""A FedAvg upload's trial: the client's local SGD steps, unrolled (Geiping et al.,
"Inverting Gradients", NeurIPS 2020, §5 "Federated averaging": the attack "unrolls" the
client's local updates inside its objective; McMahan et al., AISTATS 2017, Alg. 1).

A client that takes K SGD steps at learning rate eta on its batch (x, y) from the weights
theta_0 uploads the pseudo-gradient (theta_0 - theta_K) / eta (``fl.client.local_update``),
with theta_{k+1} = theta_k - eta grad CE(f(x; theta_k), y). One gradient at theta_0 is its
first step only. The attack's trial for images x' runs the same K steps from theta_0 on
(x', y), differentiably (``create_graph``: the distance to the upload is minimised over
x' through every step), and is compared with the upload in place of one trial gradient.
Each step trains on some rows of the trial's images (:func:`step_rows`): all of them, the
victim's batch at every step (``fl.local_steps``), or with ``fl.local_epochs`` one
mini-batch after another, epoch after epoch (Dimitrov et al., "Data Leakage in Federated
Averaging", TMLR 2022, §4.1: the simulated client; with per-epoch copies, §4.2, each epoch
its own rows, ``epoch_copies``). The model's buffers are read, not updated (LeNet and
ResNets in eval mode). :func:`stacked_unrolled_updates` runs P problems' trials at once
(``torch.func.vmap`` over ``torch.func.grad``), as the engine's stacked chunks do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from gradleak.types import Update


def step_rows(steps: int, batches: int, rows: int, copies: bool = False) -> list[slice]:
    """The rows of a trial's ``rows`` images that each of the client's ``steps`` local steps
    trains on: ``batches`` mini-batches of consecutive rows per epoch (1: every row at every
    step), the same rows each epoch, or with ``copies`` epoch e's own e-th part."""
    per_epoch = rows // (steps // batches) if copies else rows
    size = per_epoch // batches
    return [slice(start, start + size) for e in range(steps // batches)
            for start in range(e * per_epoch * copies, e * per_epoch * copies + per_epoch, size)]


def unrolled_update(model: nn.Module, x: torch.Tensor, target: torch.Tensor,
                    steps: Sequence[slice], lr: float, create_graph: bool = False) -> Update:
    """(theta_0 - theta_K) / lr after K SGD steps from ``model``'s weights, step k on the
    rows ``steps[k]`` of (x, target), differentiable in ``x`` with ``create_graph``; the
    model is not changed. ``target``: class indices (B,) or probabilities (B, classes)."""
    start = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    weights = dict(start)
    for rows in steps:
        loss = F.cross_entropy(functional_call(model, {**weights, **buffers}, (x[rows],)),
                               target[rows])
        grads = torch.autograd.grad(loss, list(weights.values()), create_graph=create_graph)
        weights = {name: w - lr * g for (name, w), g in zip(weights.items(), grads)}
    return Update({name: (start[name] - weights[name]) / lr for name in start})


def stacked_unrolled_updates(model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                             steps: Sequence[slice], lr: float) -> dict[str, torch.Tensor]:
    """:func:`unrolled_update` of P problems at once: images (P, B, ...), targets (P, B) or
    (P, B, classes); name -> (P, *shape), differentiable in ``images``."""
    start = {name: w.detach() for name, w in model.named_parameters()}
    buffers = {name: b.detach() for name, b in model.named_buffers()}

    def loss(weights: dict, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, {**weights, **buffers}, (x,)), target)

    def one(x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        weights = start
        for rows in steps:
            grads = grad(loss)(weights, x[rows], target[rows])
            weights = {name: w - lr * grads[name] for name, w in weights.items()}
        return {name: (start[name] - weights[name]) / lr for name in start}

    return vmap(one)(images, targets)

