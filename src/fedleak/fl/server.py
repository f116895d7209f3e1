"""FedAvg simulation (McMahan et al., AISTATS 2017) with a defended upload.

Each round a fraction of the K clients is sampled; each draws a batch of its own
data, computes its update (the gradient when ``local_steps`` is 1, FedSGD; else
the pseudo-gradient (theta - theta_local) / local_lr after local SGD steps),
passes it through the defense and uploads it. The server averages the uploads
and applies them with its optimiser: SGD, or Adam (FedAdam, Reddi et al., ICLR
2021), which trains the Sigmoid LeNet of DLG reliably from its U(-0.5, 0.5) init.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from fedleak.data.datasets import ImageData
from fedleak.defenses.base import Defense, DefenseContext
from fedleak.fl.client import Update, gradient
from fedleak.metrics.utility import accuracy

SERVER_OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class FLSettings:
    rounds: int = 200
    client_batch_size: int = 32
    local_steps: int = 1
    local_lr: float = 0.1
    server_optimizer: str = "adam"
    server_lr: float = 1e-2
    participation: float = 1.0
    eval_every: int = 10

    def __post_init__(self) -> None:
        for key in ("rounds", "client_batch_size", "local_steps", "eval_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"fl.{key} must be >= 1, got {getattr(self, key)}")
        if self.server_optimizer not in SERVER_OPTIMIZERS:
            raise ValueError(f"fl.server_optimizer must be one of {SERVER_OPTIMIZERS}, "
                             f"got {self.server_optimizer!r}")
        if not 0 < self.participation <= 1:
            raise ValueError(f"fl.participation must be in (0, 1], got {self.participation}")


def _client_update(model: nn.Module, sample: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                   settings: FLSettings, defense: Defense, generator: torch.Generator) -> Update:
    x, y = sample()
    if settings.local_steps == 1:
        return defense(DefenseContext(model=model, x=x, y=y, generator=generator))
    local = copy.deepcopy(model)
    opt = torch.optim.SGD(local.parameters(), lr=settings.local_lr)
    for step in range(settings.local_steps):
        xb, yb = (x, y) if step == 0 else sample()
        for p, g in zip(local.parameters(), gradient(local, xb, yb).values()):
            p.grad = g
        opt.step()
    pseudo = {n: (p0.detach() - p1.detach()) / settings.local_lr
              for (n, p0), p1 in zip(model.named_parameters(), local.parameters())}
    return defense(DefenseContext(model=model, x=x, y=y, generator=generator, gradient=pseudo))


def run_federated(model: nn.Module, train: ImageData, test: ImageData,
                  partition: list[np.ndarray], defense: Defense, settings: FLSettings,
                  seed: int, on_round: Callable[[int, nn.Module], None] | None = None,
                  progress: bool = True) -> list[dict]:
    """Train ``model`` in place; returns the evaluation history [{round, accuracy}, ...].

    ``on_round(r, model)`` is called before round r runs (r = 0 is the initial model)
    and once more after the last round.
    """
    rng = np.random.default_rng(seed)
    noise = torch.Generator().manual_seed(int(rng.integers(2**62)))
    names = [n for n, _ in model.named_parameters()]
    if settings.server_optimizer == "adam":
        server = torch.optim.Adam(model.parameters(), lr=settings.server_lr)
    else:
        server = torch.optim.SGD(model.parameters(), lr=settings.server_lr)
    per_round = max(1, round(settings.participation * len(partition)))
    history: list[dict] = []
    for r in tqdm(range(settings.rounds), desc=f"FL {defense.name}", disable=not progress,
                  leave=False):
        if on_round is not None:
            on_round(r, model)
        if r % settings.eval_every == 0:
            history.append({"round": r, "accuracy": accuracy(model, test.x, test.y)})
        model.train()
        uploads = []
        for client in sorted(rng.choice(len(partition), per_round, replace=False)):
            shard = partition[client]

            def sample(shard=shard) -> tuple[torch.Tensor, torch.Tensor]:
                size = min(settings.client_batch_size, len(shard))
                idx = torch.from_numpy(rng.choice(shard, size, replace=False))
                return train.x[idx], train.y[idx]

            uploads.append(_client_update(model, sample, settings, defense, noise))
        server.zero_grad()
        for name, param in zip(names, model.parameters()):
            param.grad = torch.stack([u[name] for u in uploads]).mean(0).detach()
        server.step()
    if on_round is not None:
        on_round(settings.rounds, model)
    history.append({"round": settings.rounds, "accuracy": accuracy(model, test.x, test.y)})
    return history
