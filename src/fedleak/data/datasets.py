"""Datasets as float tensors in [0, 1], shape (N, C, H, W), with integer labels.

- ``digits``: scikit-learn's bundled handwritten digits (1,797 images, 8x8, 10
  classes), bilinearly upsampled to 32x32; 1 or 3 channels.
- ``natural``: seeded random 32x32 crops, at several scales, of the photographs
  bundled with scikit-image (``skimage.data``); label = index of the photograph.
- ``mnist``: the MNIST idx files read with torchvision's readers from a local
  root laid out as torchvision does (``<root>/MNIST/raw/``).
- ``cifar10``, ``cifar100``, ``svhn``: torchvision's datasets from a local root,
  downloaded by torchvision only when ``download`` is set.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

DATASETS = ("digits", "natural", "mnist", "cifar10", "cifar100", "svhn")
TORCHVISION = {"cifar10": ("CIFAR10", "cifar-10-batches-py"),
               "cifar100": ("CIFAR100", "cifar-100-python"), "svhn": ("SVHN", "svhn")}
NATURAL_PHOTOS = (
    "astronaut", "brick", "camera", "cat", "coffee", "coins", "grass", "gravel",
    "hubble_deep_field", "immunohistochemistry", "moon", "retina", "rocket", "text",
)


@dataclass(frozen=True)
class ImageData:
    x: torch.Tensor  # (N, C, H, W) float32 in [0, 1]
    y: torch.Tensor  # (N,) int64
    num_classes: int

    def __post_init__(self) -> None:
        if self.x.ndim != 4 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"expected x (N,C,H,W) and y (N,), got {tuple(self.x.shape)} "
                             f"and {tuple(self.y.shape)}")

    def __len__(self) -> int:
        return self.x.shape[0]


def to_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if x.shape[1] == channels:
        return x
    if x.shape[1] == 1:
        return x.repeat(1, 3, 1, 1)
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True)


def load_digits(channels: int = 1, size: int = 32) -> ImageData:
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    y = torch.from_numpy(bunch.target.astype(np.int64))
    return ImageData(to_channels(x, channels).contiguous(), y, 10)


def load_natural(count: int, seed: int, channels: int = 3, size: int = 32) -> ImageData:
    """``count`` random ``size``x``size`` crops of skimage's bundled photographs."""
    import skimage.data
    from skimage.color import gray2rgb
    from skimage.transform import rescale
    from skimage.util import img_as_float32

    if count <= 0:
        raise ValueError(f"natural crop count must be > 0, got {count}")
    rng = np.random.default_rng(seed)
    pyramids = []
    for name in NATURAL_PHOTOS:
        image = img_as_float32(getattr(skimage.data, name)())
        image = gray2rgb(image) if image.ndim == 2 else image[..., :3]
        levels = []
        for short_side in (48, 96, 192):
            factor = short_side / min(image.shape[:2])
            if factor < 1:
                levels.append(rescale(image, factor, channel_axis=-1, anti_aliasing=True))
        pyramids.append(levels)
    crops = np.empty((count, size, size, 3), dtype=np.float32)
    labels = np.empty(count, dtype=np.int64)
    for i in range(count):
        photo = int(rng.integers(len(pyramids)))
        level = pyramids[photo][int(rng.integers(len(pyramids[photo])))]
        top = int(rng.integers(level.shape[0] - size + 1))
        left = int(rng.integers(level.shape[1] - size + 1))
        crop = level[top:top + size, left:left + size]
        crops[i] = crop[:, ::-1] if rng.random() < 0.5 else crop
        labels[i] = photo
    x = torch.from_numpy(crops).permute(0, 3, 1, 2).clamp(0, 1)
    return ImageData(to_channels(x, channels).contiguous(), torch.from_numpy(labels),
                     len(NATURAL_PHOTOS))


def load_mnist(root: str | Path, split: str = "test", download: bool = False) -> ImageData:
    """MNIST from ``<root>/MNIST/raw`` (idx files, gzipped or not), read by torchvision."""
    from torchvision.datasets import MNIST
    from torchvision.datasets.mnist import read_image_file, read_label_file

    if split not in ("train", "test"):
        raise ValueError(f"mnist split must be 'train' or 'test', got {split!r}")
    raw = Path(root) / "MNIST" / "raw"
    prefix = "t10k" if split == "test" else "train"
    names = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")

    def locate(name: str) -> Path | None:
        for candidate in (raw / name, raw / f"{name}.gz"):
            if candidate.is_file():
                return candidate
        return None

    if download and not all(locate(n) for n in names):
        try:
            MNIST(str(root), train=split == "train", download=True)
        except Exception as exc:  # no network, mirror down, ...
            raise FileNotFoundError(
                f"MNIST {split} split not found under {raw} and the download failed ({exc}); "
                f"place {names[0]}.gz and {names[1]}.gz there") from exc
    found = [locate(n) for n in names]
    if not all(found):
        raise FileNotFoundError(
            f"MNIST {split} split not found: expected {raw / names[0]}(.gz) and "
            f"{raw / names[1]}(.gz); set data.mnist.root to the folder holding MNIST/raw "
            f"or data.mnist.download: true where a network is available")
    with tempfile.TemporaryDirectory() as tmp:
        plain = []
        for path in found:
            if path.suffix == ".gz":
                target = Path(tmp) / path.stem
                with gzip.open(path, "rb") as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                path = target
            plain.append(path)
        images = read_image_file(str(plain[0]))
        labels = read_label_file(str(plain[1]))
    x = (images.float() / 255.0).unsqueeze(1).contiguous()
    return ImageData(x, labels.long(), 10)


def load_torchvision(name: str, root: str | Path, split: str = "train",
                     download: bool = False) -> ImageData:
    """CIFAR-10, CIFAR-100 or SVHN through torchvision, as float tensors in [0, 1]."""
    import torchvision

    if name not in TORCHVISION:
        raise ValueError(f"unknown torchvision dataset {name!r}; "
                         f"expected one of {sorted(TORCHVISION)}")
    if split not in ("train", "test"):
        raise ValueError(f"{name} split must be 'train' or 'test', got {split!r}")
    cls_name, folder = TORCHVISION[name]
    cls = getattr(torchvision.datasets, cls_name)
    kwargs = {"split": split} if name == "svhn" else {"train": split == "train"}
    try:
        ds = cls(str(root), download=download, **kwargs)
    except (RuntimeError, OSError) as exc:
        raise FileNotFoundError(
            f"{name} {split} split not found under {Path(root) / folder} ({exc}); "
            f"set datasets.{name}.root to the folder that holds it, or "
            f"datasets.{name}.download: true where a network is available") from exc
    images = ds.data if name == "svhn" else ds.data.transpose(0, 3, 1, 2)
    labels = ds.labels if name == "svhn" else ds.targets
    x = torch.from_numpy(np.ascontiguousarray(images)).float() / 255.0
    classes = 100 if name == "cifar100" else 10
    return ImageData(x, torch.as_tensor(np.asarray(labels), dtype=torch.int64), classes)


def load(name: str, **options) -> ImageData:
    """Load a dataset by name; options are those of the loader."""
    if name in TORCHVISION:
        return load_torchvision(name, **options)
    loaders = {"digits": load_digits, "natural": load_natural, "mnist": load_mnist}
    if name not in loaders:
        raise ValueError(f"unknown dataset {name!r}; expected one of {sorted(loaders)}")
    return loaders[name](**options)
