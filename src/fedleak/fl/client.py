"""One client's round: its update (FedSGD gradient, or FedAvg's pseudo-gradient after local
SGD steps) passed through its defense."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from fedleak.types import DefenseContext, Update

# (x, y) or, for attribute tasks, (x, y, {attribute: (B,) values})
Batch = tuple[torch.Tensor, ...]
Defense = Callable[[DefenseContext], Update]


def local_update(model: nn.Module, batches: Callable[[int], Batch], steps: int,
                 lr: float) -> Update:
    """(theta - theta_local) / lr after ``steps`` SGD steps on ``batches(step)``; the model
    is not changed. With one step this is the gradient of the first batch."""
    local = copy.deepcopy(model)
    opt = torch.optim.SGD(local.parameters(), lr=lr)
    for step in range(steps):
        for p, g in zip(local.parameters(), Update.of(local, *batches(step)[:2]).values()):
            p.grad = g
        opt.step()
    return Update({n: (p0.detach() - p1.detach()) / lr
                   for (n, p0), p1 in zip(model.named_parameters(), local.parameters())})


def client_context(model: nn.Module, batches: Callable[[int], Batch], local_steps: int,
                   local_lr: float, rng: torch.Generator, client: int | None = None
                   ) -> DefenseContext:
    """What the defense of a client (its index ``client`` in the partition, where an FL
    run makes it) whose step-``s`` batch is ``batches(s)`` sees.

    One local step (FedSGD) uploads the gradient of ``batches(0)``; more steps upload the
    pseudo-gradient of :func:`local_update`. The defense sees the first batch either way.
    """
    x, y, *rest = batches(0)
    attributes = rest[0] if rest else None
    pseudo = None if local_steps == 1 else local_update(
        model, lambda s: (x, y) if s == 0 else batches(s), local_steps, local_lr)
    return DefenseContext(model, x, y, rng, gradient=pseudo, attributes=attributes,
                          client=client)


def client_update(model: nn.Module, batches: Callable[[int], Batch], local_steps: int,
                  local_lr: float, defense: Defense, rng: torch.Generator,
                  client: int | None = None) -> Update:
    """The defended upload of a client (:func:`client_context`)."""
    return defense(client_context(model, batches, local_steps, local_lr, rng, client))
