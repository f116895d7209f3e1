"""Handwritten digits: scikit-learn's bundled 8x8 digits (1,797 images, 10 classes)
bilinearly upsampled, and MNIST's idx files read with torchvision's readers from a local
root laid out as torchvision does (``<root>/MNIST/raw/``)."""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gradleak.data.image_data import ImageData, to_channels

DIGITS_COUNT = 1797  # scikit-learn's bundled digits


def load_digits(channels: int = 1, size: int = 32) -> ImageData:
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    y = torch.from_numpy(bunch.target.astype(np.int64))
    return ImageData(to_channels(x, channels).contiguous(), y, 10)


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
            f"{raw / names[1]}(.gz); set datasets.mnist.root to the folder holding MNIST/raw "
            f"or datasets.mnist.download: true where a network is available")
    with tempfile.TemporaryDirectory() as tmp:
        read = []
        for path, reader in zip(found, (read_image_file, read_label_file)):
            try:
                if path.suffix == ".gz":
                    target = Path(tmp) / path.stem
                    with gzip.open(path, "rb") as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    plain = target
                else:
                    plain = path
                read.append(reader(str(plain)))
            except (OSError, EOFError, RuntimeError, ValueError, AssertionError) as err:
                raise ValueError(
                    f"MNIST file {path} is truncated or corrupted ({type(err).__name__}: "
                    f"{' '.join(str(err).split())[:120] or 'bad header'}); replace it with a "
                    f"fresh copy, e.g. delete it and run torchvision.datasets.MNIST(root, "
                    f"download=True) where a network is available") from None
        images, labels = read
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"MNIST files {found[0]} and {found[1]} do not match: "
                         f"{tuple(images.shape)} images, {tuple(labels.shape)} labels; "
                         f"replace them with fresh copies (torchvision.datasets.MNIST)")
    x = (images.float() / 255.0).unsqueeze(1).contiguous()
    return ImageData(x, labels.long(), 10)
