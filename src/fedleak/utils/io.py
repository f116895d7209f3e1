"""Atomic writers: every artifact is written to a temporary file, then renamed."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path next to ``path``; rename it over ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_with(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    text = json.dumps(obj, sort_keys=True, indent=2, allow_nan=True) + "\n"
    return _write_with(path, lambda t: t.write_text(text))


def write_text(path: str | os.PathLike, text: str) -> Path:
    return _write_with(path, lambda t: t.write_text(text))


def save_npy(path: str | os.PathLike, array: np.ndarray) -> Path:
    def writer(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, array, allow_pickle=False)

    return _write_with(path, writer)


def save_torch(path: str | os.PathLike, obj: Any) -> Path:
    return _write_with(path, lambda t: torch.save(obj, t))


def load_torch(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return torch.load(path, map_location="cpu", weights_only=True)


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_image_grid(images: torch.Tensor, path: str | os.PathLike, nrow: int) -> Path:
    """Images in [0, 1] as one PNG grid, ``nrow`` per row (torchvision's ``make_grid``)."""
    from PIL import Image
    from torchvision.utils import make_grid

    grid = make_grid(images.clamp(0, 1), nrow=nrow, padding=2, pad_value=1.0)
    array = (grid.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    return _write_with(path, lambda tmp: Image.fromarray(array).save(tmp, format="PNG"))
