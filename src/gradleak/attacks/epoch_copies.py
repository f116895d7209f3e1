"""Reconstruction across local epochs (Dimitrov et al., "Data Leakage in Federated
Averaging", TMLR 2022, §4.2; their code's ``full_many`` simulation).

A client that trains E epochs over its N images in M mini-batches visits them in a fresh
random order each epoch, which the attacker does not know. The attack therefore gives each
epoch its own copy of the N images: the trial's E N images, epoch e's copy in rows
[e N, (e + 1) N), its mini-batches consecutive rows (``unrolled.step_rows``), each copy
labelled alike (the client's labels, inferred once). Since every epoch sees the same
images, the copies' epoch means must agree: the order-invariant prior

    R(x) = mean_{e, e'} mean_pixels (mean_i x^(e)_i - mean_i x^(e')_i)^2

(their ``l2_mean`` prior, weight 1000 in their FEMNIST runs) is added to the loss. After
the optimisation each epoch's copy is matched to the first's by the Hungarian assignment
on PSNR, and the matched images are averaged into the N reconstructed images.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from gradleak.attacks.label_inference import infer_labels
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.types import Observation


@dataclass(eq=False)
class EpochCopies(Observation):
    """A client's upload of ``epochs`` epochs over its N images, attacked through a copy per
    epoch: ``batch_size`` is E N (the trial's images), ``labels`` the N labels tiled E times,
    ``prior_weight`` the order-invariant prior's weight."""

    epochs: int = 1
    prior_weight: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local_steps != self.epochs * self.local_batches or self.batch_size % self.epochs:
            raise ValueError(f"EpochCopies of {self.epochs} epochs needs local_steps = epochs x "
                             f"local_batches and batch_size a multiple of epochs; got "
                             f"{self.local_steps}, {self.local_batches} and {self.batch_size}")
        if self.labels is None:
            raise ValueError("EpochCopies needs the labels of every copy; got labels=None")

    @classmethod
    def of(cls, obs: Observation, prior_weight: float) -> EpochCopies:
        """The copies of a client's upload ``obs`` (its ``batch_size`` N images), labelled
        with its labels, known or inferred."""
        epochs = obs.local_steps // obs.local_batches
        labels = infer_labels(obs).repeat(epochs)
        return cls(**{**vars(obs), "batch_size": epochs * obs.batch_size, "labels": labels},
                   epochs=epochs, prior_weight=prior_weight)


def order_invariant_prior(images: torch.Tensor, epochs: int) -> torch.Tensor:
    """R (module docstring) of P problems' images (P, E N, ...) -> (P,)."""
    means = images.unflatten(1, (epochs, -1)).mean(2).flatten(2)  # (P, E, pixels)
    return (means.unsqueeze(1) - means.unsqueeze(2)).square().mean((1, 2, 3))


def matched(reference: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
    """``copy``'s images (N, ...) reordered to ``reference``'s: the assignment of highest
    summed PSNR."""
    from scipy.optimize import linear_sum_assignment  # imported on use: slow to import

    mse = (reference.unsqueeze(1) - copy.unsqueeze(0)).square().flatten(2).mean(2)
    rows, cols = linear_sum_assignment((10 * torch.log10(mse.clamp_min(1e-10))).cpu().numpy())
    return copy[torch.from_numpy(cols[rows.argsort()]).to(copy.device)]


def merged_images(images: torch.Tensor, epochs: int) -> torch.Tensor:
    """The N images of E copies (E N, ...): each copy matched to the first, averaged."""
    copies = images.unflatten(0, (epochs, -1))
    return torch.stack([copies[0]] + [matched(copies[0], c) for c in copies[1:]]).mean(0)


def merged(rec: Reconstruction, epochs: int) -> Reconstruction:
    """A reconstruction of E copies as one of the client's N images (snapshots too)."""
    return replace(rec, images=merged_images(rec.images, epochs),
                   labels=rec.labels[:len(rec.labels) // epochs],
                   snapshots={t: merged_images(s, epochs) for t, s in rec.snapshots.items()})
