"""The samples every loader returns (:class:`ImageData`), the conversions loaders share
(``to_channels``, ``resized``, ``resize_crops``) and the paper datasets' shapes that stand-ins take
(``SHAPES``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# (channels, height, width, classes) of the datasets a stand-in imitates
SHAPES = {"mnist": (1, 28, 28, 10), "cifar10": (3, 32, 32, 10), "cifar100": (3, 32, 32, 100),
          "svhn": (3, 32, 32, 10), "imagenet": (3, 64, 64, 1000),
          "tinyimagenet": (3, 64, 64, 200), "ffhq": (3, 32, 32, 10),
          # attribute datasets: task classes; adult's rows are (1, 1, features)
          "mnist_attributes": (1, 28, 28, 2), "adult": (1, 1, 103, 2), "lfw": (3, 62, 47, 2),
          "celeba": (3, 32, 32, 2), "audiomnist": (1, 64, 64, 10)}


@dataclass(frozen=True)
class ImageData:
    """Images (or tabular rows stored as (N, 1, 1, F)) with task labels and, for attribute
    tasks (RecUP-FL), sensitive attributes: name -> (N,) int64, independent of ``y``."""

    x: torch.Tensor  # (N, C, H, W) float32 in [0, 1]
    y: torch.Tensor  # (N,) int64
    num_classes: int
    attributes: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.x.ndim != 4 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"expected x (N,C,H,W) and y (N,), got {tuple(self.x.shape)} "
                             f"and {tuple(self.y.shape)}")
        for name, values in self.attributes.items():
            if tuple(values.shape) != (self.x.shape[0],):
                raise ValueError(f"attribute {name!r} must have shape ({self.x.shape[0]},), "
                                 f"got {tuple(values.shape)}")

    def __len__(self) -> int:
        return self.x.shape[0]

    def subset(self, idx: torch.Tensor) -> ImageData:
        """The samples at ``idx``, attributes included."""
        return ImageData(self.x[idx], self.y[idx], self.num_classes,
                         {k: v[idx] for k, v in self.attributes.items()})

    def to(self, device: torch.device | str) -> ImageData:
        """The same samples with every tensor on ``device`` (a phase's data, moved once)."""
        return ImageData(self.x.to(device), self.y.to(device), self.num_classes,
                         {k: v.to(device) for k, v in self.attributes.items()})


def to_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if x.shape[1] == channels:
        return x
    if x.shape[1] == 1:
        return x.repeat(1, 3, 1, 1)
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype, device=x.device)
    return (x * weights.view(1, 3, 1, 1)).sum(1, keepdim=True)


def resize_crops(crops: Iterable[torch.Tensor], size: tuple[int, int],
                 chunk: int = 512) -> torch.Tensor:
    """uint8 crops (C, h, w) of one shape, read lazily -> float (N, C, *size) in [0, 1]
    (bilinear, antialiased), ``chunk`` crops in memory at a time."""
    def resize(batch: list[torch.Tensor]) -> torch.Tensor:
        return F.interpolate(torch.stack(batch).float() / 255.0, size=size, mode="bilinear",
                             align_corners=False, antialias=True).clamp(0, 1)

    out, batch = [], []
    for crop in crops:
        batch.append(crop)
        if len(batch) == chunk:
            out.append(resize(batch))
            batch = []
    if batch:
        out.append(resize(batch))
    if not out:
        raise ValueError("no images to load")
    return torch.cat(out)


def resized(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``images`` (N, C, H, W) at (H, W) ``size``, bilinear (unchanged when they have it)."""
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False)
