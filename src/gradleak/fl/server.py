"""FedAvg simulation (McMahan et al., AISTATS 2017) with a defended upload.

Each round a fraction of the K clients is sampled; each draws a batch of its own
data, computes its update (the gradient when ``local_steps`` is 1, FedSGD; else
the pseudo-gradient (theta - theta_local) / local_lr after local SGD steps, each on a
batch drawn afresh, or with ``local_epochs`` after that many passes over its shard,
``fl.client.epoch_schedule``),
passes it through the defense and uploads it. The server averages the uploads
and applies them with its optimiser: SGD, or Adam (FedAdam, Reddi et al., ICLR
2021), which trains the Sigmoid LeNet of DLG reliably from its U(-0.5, 0.5) init.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from gradleak.data.image_data import ImageData
from gradleak.fl.client import Defense, client_update, epoch_schedule
from gradleak.metrics.utility import evaluate


@dataclass(frozen=True)
class FLSettings:
    """The configuration's ``fl:`` block (its schema holds the defaults), seeds aside."""

    rounds: int
    client_batch_size: int
    local_steps: int
    local_lr: float
    local_epochs: int
    server_optimizer: str
    server_lr: float
    participation: float
    eval_every: int

    @classmethod
    def from_config(cls, fl: Mapping) -> FLSettings:
        return cls(**{f.name: fl[f.name] for f in fields(cls)})


def run_federated(model: nn.Module, train: ImageData, test: ImageData,
                  partition: list[np.ndarray], defense: Defense, settings: FLSettings,
                  seed: int, on_round: Callable[[int, nn.Module], None] | None = None,
                  progress: bool = True, keep: Callable[[dict], None] | None = None,
                  resume_from: dict | None = None) -> list[dict]:
    """Train ``model`` in place; returns the evaluation history [{round, accuracy,
    test_loss, uploads, fallbacks}, ...]: ``uploads`` counts the client updates since the
    previous entry and ``fallbacks`` those a defense reported as the clean gradient
    (``Update.info["fallback"]``, CENSOR's Alg. 1 reading).

    ``on_round(r, model)`` is called before round r runs (r = 0 is the initial model)
    and once more after the last round. Clients' batches are indexed where ``train`` lies
    (a phase puts its data on its device once, beside ``model``).

    ``keep(state)`` is handed the run's whole state at each evaluation round after the
    first; ``resume_from``, such a state, continues the run from there as if it had not
    stopped (``experiment.resume``).
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
    counts = {"uploads": 0, "fallbacks": 0}

    def evaluated(r: int) -> dict:
        entry = {"round": r, **evaluate(model, test.x, test.y), **counts}
        counts.update(uploads=0, fallbacks=0)
        return entry

    def state(r: int) -> dict:
        return {"round": r, "model": model.state_dict(), "server": server.state_dict(),
                "rng": json.dumps(rng.bit_generator.state), "noise": noise.get_state(),
                "history": history, "counts": dict(counts)}

    first = 0
    if resume_from is not None:  # its round `first` was checkpointed and evaluated
        first = resume_from["round"]
        model.load_state_dict(resume_from["model"])
        server.load_state_dict(resume_from["server"])
        rng.bit_generator.state = json.loads(resume_from["rng"])
        noise.set_state(resume_from["noise"])
        history += resume_from["history"]
        counts.update(resume_from["counts"])
    for r in tqdm(range(first, settings.rounds), desc=f"FL {getattr(defense, 'name', 'defense')}",
                  initial=first, total=settings.rounds, disable=not progress, leave=False):
        if resume_from is None or r > first:
            if on_round is not None:
                on_round(r, model)
            if r % settings.eval_every == 0:
                history.append(evaluated(r))
                if keep is not None and r:
                    keep(state(r))
        model.train()
        uploads = []
        for client in sorted(rng.choice(len(partition), per_round, replace=False)):
            shard = partition[client]
            size = min(settings.client_batch_size, len(shard))
            schedule = (epoch_schedule(len(shard), size, settings.local_epochs, rng)
                        if settings.local_epochs else None)

            def batch(step: int, shard=shard, size=size, schedule=schedule) -> tuple:
                chosen = (rng.choice(shard, size, replace=False) if schedule is None
                          else shard[schedule[step]])
                idx = torch.from_numpy(chosen).to(train.x.device)
                if train.attributes:
                    return train.x[idx], train.y[idx], {k: v[idx] for k, v in
                                                        train.attributes.items()}
                return train.x[idx], train.y[idx]

            steps = settings.local_steps if schedule is None else len(schedule)
            uploads.append(client_update(model, batch, steps, settings.local_lr,
                                         defense, noise, int(client)))
            counts["uploads"] += 1
            counts["fallbacks"] += int(getattr(uploads[-1], "info", {}).get("fallback", False))
        server.zero_grad()
        for name, param in zip(names, model.parameters()):
            param.grad = torch.stack([u[name] for u in uploads]).mean(0).detach()
        server.step()
    if on_round is not None:
        on_round(settings.rounds, model)
    history.append(evaluated(settings.rounds))
    return history
