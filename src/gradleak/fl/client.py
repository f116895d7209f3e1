"""One client's round: its update (FedSGD gradient, or FedAvg's pseudo-gradient after local
SGD steps) passed through its defense."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from gradleak.types import DefenseContext, Update

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


def epoch_schedule(size: int, batch_size: int, epochs: int, rng: np.random.Generator
                   ) -> list[np.ndarray]:
    """A client's local steps over its ``size`` samples for ``fl.local_epochs`` (Dimitrov et
    al., "Data Leakage in Federated Averaging", TMLR 2022, §2; McMahan et al., Alg. 1):
    ``epochs`` passes, each in a fresh random order, in mini-batches of ``batch_size`` (the
    last of a pass smaller when it does not divide ``size``); one index array per step."""
    steps = []
    for _ in range(epochs):
        order = rng.permutation(size)
        steps += [np.sort(order[i:i + batch_size]) for i in range(0, size, batch_size)]
    return steps


def batch_schedule(size: int, steps: int, epochs: int, batch_size: int,
                   rng: np.random.Generator) -> list:
    """The rows of a client's batch of ``size`` samples each of its local steps trains on:
    all of them at each of ``steps`` steps, or with ``epochs`` (``fl.local_epochs``) the
    mini-batches of :func:`epoch_schedule` (of ``batch_size``, at most ``size``)."""
    if not epochs:
        return [slice(None)] * steps
    return [torch.from_numpy(rows) for rows in
            epoch_schedule(size, min(batch_size, size), epochs, rng)]


def rows_of(batch: Batch, rows: slice | torch.Tensor) -> Batch:
    """A client batch (x, y[, attributes]) at ``rows``."""
    return tuple(part[rows] if isinstance(part, torch.Tensor)
                 else {a: values[rows] for a, values in part.items()} for part in batch)


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
