"""Two clients' rounds: CENSOR (Zhang et al., NDSS 2025) §III, Observation 1, Fig. 2.

"we design an experiment with over a thousand clients. Each client processes data with a
batch size of 1. To speed up the training within this simulation, we employ a setup
consisting of one victim client with a batch size of 1, and another local client with a
larger batch size of 1024. Both clients utilize a stochastic gradient descent (SGD)
optimizer". The attacks then invert the victim's batch-size-1 upload at rounds 0-4.

Each round both clients upload as FL clients do (:func:`fl.client_update`: local steps,
then the defense); the server averages the two uploads weighted by batch size,
(B_v g_v + B_o g_o) / (B_v + B_o) (for FedSGD the gradient of the mean loss over the
B_v + B_o images: one round of that many one-image clients) and applies it with its
optimiser (SGD or Adam at the server learning rate, as :func:`fl.run_federated` does).
An honest-but-curious server sees each client's upload, so what the attacker observes at
round r is the victim's own upload under the model these rounds have trained.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from gradleak.fl.client import Batch, Defense, client_update
from gradleak.types import Update


def weighted_mean(uploads: list[Update], weights: list[int]) -> Update:
    """sum_i w_i u_i / sum_i w_i, tensor by tensor."""
    total = float(sum(weights))
    return Update({name: sum(w * u[name] for u, w in zip(uploads, weights)) / total
                   for name in uploads[0]})


def two_client_rounds(model: nn.Module, victim: Batch, other: Callable[[int, int], Batch],
                      rounds: int, local_steps: int, local_lr: float, server_optimizer: str,
                      server_lr: float, defense: Defense, rng: torch.Generator
                      ) -> tuple[nn.Module, list[Update]]:
    """A copy of ``model`` after ``rounds`` rounds of the victim (always its batch
    ``victim``) and another client (its step-``s`` batch of round ``r``: ``other(r, s)``),
    and the aggregate the server applied in each round. ``model`` is not changed."""
    model = copy.deepcopy(model)
    params = list(model.parameters())
    server = (torch.optim.Adam(params, lr=server_lr) if server_optimizer == "adam"
              else torch.optim.SGD(params, lr=server_lr))
    applied = []
    for r in range(rounds):
        model.train()
        uploads = [client_update(model, lambda _step: victim, local_steps, local_lr, defense,
                                 rng),
                   client_update(model, lambda step, r=r: other(r, step), local_steps,
                                 local_lr, defense, rng)]
        aggregate = weighted_mean(uploads, [len(victim[1]), len(other(r, 0)[1])])
        server.zero_grad()
        for (name, param) in model.named_parameters():
            param.grad = aggregate[name].detach()
        server.step()
        applied.append(aggregate)
    return model, applied
