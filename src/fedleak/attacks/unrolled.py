"""A FedAvg upload's trial: the client's local SGD steps, unrolled (Geiping et al.,
"Inverting Gradients", NeurIPS 2020, §5 "Federated averaging": the attack "unrolls" the
client's local updates inside its objective; McMahan et al., AISTATS 2017, Alg. 1).

A client that takes K SGD steps at learning rate eta on its batch (x, y) from the weights
theta_0 uploads the pseudo-gradient (theta_0 - theta_K) / eta (``fl.client.local_update``),
with theta_{k+1} = theta_k - eta grad CE(f(x; theta_k), y). One gradient at theta_0 is its
first step only. The attack's trial for images x' runs the same K steps from theta_0 on
(x', y), differentiably (``create_graph``: the distance to the upload is minimised over
x' through every step), and is compared with the upload in place of one trial gradient.
The client's batch is the same at every step here (the victims' uploads:
``experiment.victims``); the model's buffers are read, not updated (LeNet and ResNets in
eval mode). :func:`stacked_unrolled_updates` runs P problems' trials at once
(``torch.func.vmap`` over ``torch.func.grad``), as the engine's stacked chunks do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedleak.types import Update


def unrolled_update(model: nn.Module, x: torch.Tensor, target: torch.Tensor, steps: int,
                    lr: float, create_graph: bool = False) -> Update:
    """(theta_0 - theta_K) / lr after ``steps`` SGD steps on (x, target) from ``model``'s
    weights, differentiable in ``x`` with ``create_graph``; the model is not changed.
    ``target``: class indices (B,) or probabilities (B, classes)."""
    start = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    weights = dict(start)
    for _ in range(steps):
        loss = F.cross_entropy(functional_call(model, {**weights, **buffers}, (x,)), target)
        grads = torch.autograd.grad(loss, list(weights.values()), create_graph=create_graph)
        weights = {name: w - lr * g for (name, w), g in zip(weights.items(), grads)}
    return Update({name: (start[name] - weights[name]) / lr for name in start})


def stacked_unrolled_updates(model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                             steps: int, lr: float) -> dict[str, torch.Tensor]:
    """:func:`unrolled_update` of P problems at once: images (P, B, ...), targets (P, B) or
    (P, B, classes); name -> (P, *shape), differentiable in ``images``."""
    start = {name: w.detach() for name, w in model.named_parameters()}
    buffers = {name: b.detach() for name, b in model.named_buffers()}

    def loss(weights: dict, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, {**weights, **buffers}, (x,)), target)

    def one(x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        weights = start
        for _ in range(steps):
            grads = grad(loss)(weights, x, target)
            weights = {name: w - lr * grads[name] for name, w in weights.items()}
        return {name: (start[name] - weights[name]) / lr for name in start}

    return vmap(one)(images, targets)

