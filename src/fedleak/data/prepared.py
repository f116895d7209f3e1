"""Prepared dataset folders: ``{split}_x.npy``, ``{split}_y.npy`` and ``manifest.json``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedleak.data.datasets import ImageData, load
from fedleak.data.splits import stratified_splits
from fedleak.utils.io import read_json, save_npy, sha256_file, write_json

MANIFEST = "manifest.json"


def prepare(name: str, out_dir: str | Path, options: dict, splits: dict[str, float],
            seed: int) -> dict:
    """Load ``name``, split it, write the arrays and a manifest with counts and sha256."""
    data = load(name, **options)
    labels = data.y.numpy()
    parts = stratified_splits(labels, splits, seed) if splits else {"all": np.arange(len(data))}
    out_dir = Path(out_dir)
    manifest: dict = {"dataset": name, "options": options, "split_seed": seed,
                      "num_classes": data.num_classes,
                      "shape": list(data.x.shape[1:]), "splits": {}}
    for split, idx in parts.items():
        x = data.x[idx].numpy().astype(np.float32)
        y = labels[idx].astype(np.int64)
        x_path = save_npy(out_dir / f"{split}_x.npy", x)
        y_path = save_npy(out_dir / f"{split}_y.npy", y)
        manifest["splits"][split] = {
            "count": int(len(idx)),
            "class_counts": np.bincount(y, minlength=data.num_classes).tolist(),
            "x_sha256": sha256_file(x_path),
            "y_sha256": sha256_file(y_path),
        }
    write_json(out_dir / MANIFEST, manifest)
    return manifest


def load_prepared(data_dir: str | Path, split: str, verify: bool = True) -> ImageData:
    """Read one split of a prepared folder, checking it against the manifest."""
    data_dir = Path(data_dir)
    manifest_path = data_dir / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no prepared dataset at {data_dir} (missing {MANIFEST}); "
                                f"run `fedleak prepare-data` first")
    manifest = read_json(manifest_path)
    if split not in manifest["splits"]:
        raise ValueError(f"split {split!r} not in {data_dir}; expected one of "
                         f"{sorted(manifest['splits'])}")
    entry = manifest["splits"][split]
    x_path, y_path = data_dir / f"{split}_x.npy", data_dir / f"{split}_y.npy"
    if verify:
        for path, key in ((x_path, "x_sha256"), (y_path, "y_sha256")):
            if sha256_file(path) != entry[key]:
                raise ValueError(f"{path} does not match its manifest sha256; re-run prepare-data")
    x = torch.from_numpy(np.load(x_path))
    y = torch.from_numpy(np.load(y_path))
    return ImageData(x, y, manifest["num_classes"])
