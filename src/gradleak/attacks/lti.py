"""Learning to Invert (Wu, Chen, Guo and Weinberger, "Learning To Invert: Simple Adaptive
Attacks for Gradient Inversion in Federated Learning", UAI 2023, §3), with the official
code's defaults (wrh14/Learning_to_Invert, ``main_learn_dlg.py``).

An inversion network f maps an upload to the image it came from. The server trains it on
auxiliary data it holds, here the case's public split: pairs (D(grad_theta L(F(x), y)), x)
of each public image's upload through the setting's defense D under the attacked model
theta, by the mean squared error ||f(u) - x||^2 / d (§3, Eq. 3). The defense is learned
from its uploads, not modelled, so the attack adapts to any defense by construction
(§3.2), and attacking is one forward pass.

f is the official MLP: Linear(n, h), ReLU, Linear(h, h), ReLU, Linear(h, d), Sigmoid, with
h = 3,000; Adam at lr 1e-4, batches of 256, 200 epochs, lr x 0.1 after 75 % of them (the
configuration's ``inverter:``). Its input is the upload's coordinates in parameter order,
all of them or ``features`` chosen at random once (the official code's subset for large
models).

Departures: each public image's upload is drawn ``draws`` times before training (the
official code draws the Gaussian noise afresh every epoch; one draw of Soteria or Refiner
costs seconds); one image per upload (the paper's B = 4 matches the network's B outputs to
the images by the Hungarian algorithm; not implemented); the pipeline trains f per case,
setting and FL seed (``gradleak train-inverter``), on the public split rather than the
paper's 50,000 training images.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from gradleak.attacks.base import Attack, register
from gradleak.attacks.label_inference import infer_labels
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.victims import Victims
from gradleak.config import ConfigError
from gradleak.needs import Need
from gradleak.types import DefenseContext

LR_DROP = 0.75  # the official code: lr x 0.1 once 75 % of the epochs are done


def upload_vector(update: Mapping[str, torch.Tensor], keep: torch.Tensor | None
                  ) -> torch.Tensor:
    """The upload's coordinates in parameter order, or those at indices ``keep``."""
    flat = torch.cat([g.detach().flatten() for g in update.values()])
    return flat if keep is None else flat[keep.to(flat.device)]


class Inverter(nn.Module):
    """f: an upload's coordinates -> the image (C, H, W) in [0, 1]."""

    def __init__(self, inputs: int, hidden: int, image_shape: tuple[int, int, int],
                 keep: torch.Tensor | None = None) -> None:
        super().__init__()
        self.image_shape = tuple(image_shape)
        outputs = int(torch.tensor(self.image_shape).prod())
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, outputs), nn.Sigmoid())
        self.register_buffer("keep", torch.empty(0, dtype=torch.long) if keep is None else keep)

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        return self.net(vectors).view(-1, *self.image_shape)

    def invert(self, update: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The image (1, C, H, W) that f reads in one upload."""
        keep = self.keep if len(self.keep) else None
        with torch.no_grad():
            return self(upload_vector(update, keep)[None])


def defended_uploads(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, defense,
                     draws: int, seed: int, progress: bool = False) -> torch.Tensor:
    """(draws x N, n): each image's upload through ``defense`` at batch size 1, ``draws``
    times, in the order image 0 draw 0, image 0 draw 1, ..."""
    rng = torch.Generator().manual_seed(seed)
    rows = []
    for i in tqdm(range(len(images)), desc="defended uploads", unit="image",
                  disable=not progress, leave=False):
        for _ in range(draws):
            ctx = DefenseContext(model, images[i:i + 1], labels[i:i + 1], rng)
            rows.append(upload_vector(defense(ctx), None))
    return torch.stack(rows)


def train_inverter(uploads: torch.Tensor, images: torch.Tensor, *, hidden: int, epochs: int,
                   batch_size: int, lr: float, features: int | None, seed: int,
                   progress: bool = False) -> tuple[Inverter, list[float]]:
    """f fitted to (upload row, its image) pairs (``images`` repeated to the uploads' rows)
    by Adam on the mean squared error; the mean loss of each epoch."""
    torch.manual_seed(seed)
    draws = len(uploads) // len(images)
    targets = images.repeat_interleave(draws, 0).flatten(1)
    keep = None
    if features is not None and features < uploads.shape[1]:
        keep = torch.randperm(uploads.shape[1])[:features].sort().values
        uploads = uploads[:, keep]
    inverter = Inverter(uploads.shape[1], hidden, tuple(images.shape[1:]), keep)
    optimizer = torch.optim.Adam(inverter.parameters(), lr=lr)
    drop = torch.optim.lr_scheduler.MultiStepLR(optimizer, [int(LR_DROP * epochs)], 0.1)
    order = torch.Generator().manual_seed(seed)
    losses = []
    for _ in tqdm(range(epochs), desc="inverter", unit="epoch", disable=not progress,
                  leave=False):
        total = 0.0
        for batch in torch.randperm(len(uploads), generator=order).split(batch_size):
            optimizer.zero_grad()
            loss = ((inverter.net(uploads[batch]) - targets[batch]) ** 2).mean()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        drop.step()
        losses.append(total / len(uploads))
    return inverter.eval(), losses


@register("lti")
class LearningToInvert(Attack):
    needs = {"inverter": Need("inverter")}
    records_snapshots = False
    vectorisable = False  # one forward pass per victim, nothing to stack

    def __init__(self, *, inverter: Inverter, seed: int = 0) -> None:
        if not isinstance(inverter, Inverter):
            raise ValueError(f"lti needs inverter=, the trained inversion network (gradleak "
                             f"train-inverter), got {type(inverter).__name__}")
        self.inverter, self.seed = inverter, seed

    @classmethod
    def budget(cls, params: Mapping[str, Any]) -> int:
        """No gradient matching: one forward pass of the inverter."""
        return 0

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """One image per upload (the inverter has one image's outputs)."""
        batch = config["attack"]["protocol"]["batch_size"]
        if batch != 1:
            raise ConfigError(f"invalid config: '{where}': Learning to Invert reads one image "
                              f"per upload, but 'attack.protocol.batch_size' is {batch}; "
                              f"expected 1", key="attack.protocol.batch_size")

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        """Each victim's image as the inverter reads its upload (labels by the iDLG rule)."""
        out = []
        for obs in victims.observations:
            if obs.batch_size != 1:
                raise ValueError(f"lti inverts one image per upload; got a batch of "
                                 f"{obs.batch_size}")
            images = self.inverter.to(obs.device).invert(obs.gradient)
            out.append(Reconstruction(images, infer_labels(obs), [], 0, 0.0, "inverted"))
        return out
