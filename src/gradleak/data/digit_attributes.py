"""The digits with a task label and sensitive shape attributes (RecUP-FL's attribute
inference, on data that needs no download).

- ``digits_attributes`` (embedded, offline): scikit-learn's digits (``load_digits``).
  ``task: parity`` (default): y = digit mod 2 (0 even, 1 odd); ``task: digit``: y = digit.
  Attributes, computed from the returned images (grey level, channel mean):

  * ``ink`` (3): tercile of the ink mass (sum of the grey levels), ranked within each
    digit class, so each digit has a third in each tercile: independent of the digit
    and therefore of y;
  * ``slant`` (3): tercile, within the digit class, of the second-moment slant
    ``-mu_rc / mu_rr`` (mu: central moments of the grey levels over row r and column
    c; > 0 leans right);
  * ``stroke`` (3): tercile, within the digit class, of the stroke width = ink mass /
    skeleton length (pixels of ``skimage.morphology.skeletonize`` of the image > 0.5);
  * ``group`` (2): 1 for digits 5-9, 0 for 0-4 (a function of the digit that parity
    does not imply, but correlated with it: 0-4 holds three even digits, 5-9 two).

  Ranks break ties by sample order, so terciles are exactly balanced within each digit.
- ``mnist_attributes``: the same task and attributes from MNIST (``load_mnist``, local
  root, ``split`` test by default).

``shape_measures`` adds the bounding-box aspect and the vertical centroid to the three
measures, by name (``MEASURES``), for the attribute stand-ins (``attributes.stand_in``,
which bins one per attribute: ``attributes.STAND_IN_MEASURES``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradleak.data.digits import load_digits, load_mnist
from gradleak.data.image_data import ImageData

TASKS = {"parity": 2, "digit": 10}


def within_class_bins(values: np.ndarray, labels: np.ndarray, bins: int) -> np.ndarray:
    """Bin ``values`` into ``bins`` equal-count quantiles ranked within each label class
    (ties broken by sample order): each class has the same share in every bin."""
    values, labels = np.asarray(values, dtype=np.float64), np.asarray(labels)
    if values.shape != labels.shape or values.ndim != 1:
        raise ValueError(f"values and labels must be 1-D of one length, got {values.shape} "
                         f"and {labels.shape}")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    out = np.empty(len(values), dtype=np.int64)
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        order = idx[np.argsort(values[idx], kind="stable")]
        out[order] = np.arange(len(idx)) * bins // len(idx)
    return out


def _gray(x: torch.Tensor) -> np.ndarray:
    """(N, C, H, W) in [0, 1] -> (N, H, W) float64 grey levels (channel mean)."""
    return x.mean(1).double().numpy()


def ink_mass(gray: np.ndarray) -> np.ndarray:
    return gray.sum((1, 2))


def slant(gray: np.ndarray) -> np.ndarray:
    """Second-moment slant -mu_rc / mu_rr of each (H, W) image (> 0: the top leans right)."""
    _, h, w = gray.shape
    rows, cols = np.arange(h)[None, :, None], np.arange(w)[None, None, :]
    mass = np.maximum(gray.sum((1, 2)), 1e-12)
    dr = rows - ((gray * rows).sum((1, 2)) / mass)[:, None, None]
    dc = cols - ((gray * cols).sum((1, 2)) / mass)[:, None, None]
    mu_rr = (gray * dr**2).sum((1, 2)) / mass
    mu_rc = (gray * dr * dc).sum((1, 2)) / mass
    return -mu_rc / np.maximum(mu_rr, 1e-12)


def stroke_width(gray: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Ink mass / skeleton length (skeleton of the pixels > ``threshold``), in pixels."""
    from skimage.morphology import skeletonize

    length = np.array([skeletonize(image > threshold).sum() for image in gray], dtype=np.float64)
    return ink_mass(gray) / np.maximum(length, 1.0)


def _aspect(gray: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Bounding-box height / width of the pixels > ``threshold`` (1 for an empty image)."""
    out = np.ones(len(gray))
    for i, image in enumerate(gray > threshold):
        rows, cols = np.flatnonzero(image.any(1)), np.flatnonzero(image.any(0))
        if len(rows):
            out[i] = (rows[-1] - rows[0] + 1) / (cols[-1] - cols[0] + 1)
    return out


def _centroid_row(gray: np.ndarray) -> np.ndarray:
    rows = np.arange(gray.shape[1])[None, :, None]
    return (gray * rows).sum((1, 2)) / np.maximum(gray.sum((1, 2)), 1e-12)


MEASURES = ("ink", "slant", "stroke", "aspect", "centroid")


def shape_measures(x: torch.Tensor) -> dict[str, np.ndarray]:
    """The five ``MEASURES`` of images x (N, C, H, W): ink mass, slant, stroke width,
    bounding-box aspect and vertical centroid."""
    gray = _gray(x)
    return dict(zip(MEASURES, [ink_mass(gray), slant(gray), stroke_width(gray), _aspect(gray),
                               _centroid_row(gray)]))


def digit_attributes(x: torch.Tensor, digits: torch.Tensor) -> dict[str, torch.Tensor]:
    """``ink``, ``slant``, ``stroke`` (terciles within each digit) and ``group`` (digit >= 5)
    of images x (N, C, H, W) with digit labels (N,)."""
    gray, labels = _gray(x), digits.numpy()
    measures = {"ink": ink_mass(gray), "slant": slant(gray), "stroke": stroke_width(gray)}
    out = {name: torch.from_numpy(within_class_bins(values, labels, 3))
           for name, values in measures.items()}
    out["group"] = (digits >= 5).long()
    return out


def _task(digits: torch.Tensor, task: str) -> tuple[torch.Tensor, int]:
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    return (digits % 2 if task == "parity" else digits.clone()), TASKS[task]


def load_digits_attributes(channels: int = 1, size: int = 32,
                           task: str = "parity") -> ImageData:
    """scikit-learn's digits with y = ``task`` of the digit and the digit attributes."""
    digits = load_digits(channels, size)
    y, classes = _task(digits.y, task)
    return ImageData(digits.x, y, classes, digit_attributes(digits.x, digits.y))


def mnist_attributes_missing(options: dict) -> str | None:
    """Why MNIST cannot be read from its local root for ``mnist_attributes`` (None: it can)."""
    root = Path(options.get("root", "data"))
    raw = root / "MNIST" / "raw"
    prefix = "t10k" if options.get("split", "test") == "test" else "train"
    if all(any((raw / f"{prefix}-{kind}-idx{d}-ubyte{gz}").is_file() for gz in ("", ".gz"))
           for kind, d in (("images", 3), ("labels", 1))):
        return None
    return (f"dataset 'mnist_attributes' not found at {raw}: put the MNIST idx files "
            f"({prefix}-images-idx3-ubyte(.gz), {prefix}-labels-idx1-ubyte(.gz)) there, e.g. "
            f"with torchvision.datasets.MNIST(root, download=True) where a network is "
            f"available, or set datasets.mnist_attributes.root")


def load_mnist_attributes(root: str | Path, split: str = "test",
                          task: str = "parity") -> ImageData:
    """MNIST (local root, as ``load_mnist``) with y = ``task`` and the digit attributes."""
    if reason := mnist_attributes_missing({"root": root, "split": split}):
        raise FileNotFoundError(reason)
    mnist = load_mnist(root, split)
    y, classes = _task(mnist.y, task)
    return ImageData(mnist.x, y, classes, digit_attributes(mnist.x, mnist.y))
