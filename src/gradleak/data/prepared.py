"""Prepared dataset folders: ``{split}_x.npy``, ``{split}_y.npy`` and ``manifest.json``.

A dataset with sensitive attributes also writes ``{split}_attr_{name}.npy`` (int64) per
attribute; the manifest lists each attribute's class count under ``attributes`` and, per
split, its ``class_counts`` and ``sha256`` under ``splits.<split>.attributes``. Folders
written before attributes existed (no such keys) load with no attributes.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from gradleak.data.attributes import CLASSES
from gradleak.data.datasets import load
from gradleak.data.image_data import ImageData
from gradleak.data.splits import stratified_splits
from gradleak.utils.io import read_json, save_npy, sha256_file, write_json

MANIFEST = "manifest.json"
_REPREPARE = ("delete {0} and run snakemake again (or `gradleak prepare-data`): the folder is "
              "prepared anew")
ATTRIBUTE_NAME = re.compile(r"[a-z][a-z0-9_]*")


def _attribute_classes(name: str, data: ImageData) -> dict[str, int]:
    """Attribute -> class count: the dataset's documented count, else the largest class + 1."""
    out = {}
    for attr, values in data.attributes.items():
        if not ATTRIBUTE_NAME.fullmatch(attr):
            raise ValueError(f"attribute name {attr!r} must match {ATTRIBUTE_NAME.pattern} "
                             f"(it names a file)")
        if len(values) and int(values.min()) < 0:
            raise ValueError(f"attribute {attr!r} has negative class {int(values.min())}")
        top = int(values.max()) + 1 if len(values) else 0
        out[attr] = max(CLASSES.get(name, {}).get(attr, 0), top)
    return out


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
    attribute_classes = _attribute_classes(name, data)
    if attribute_classes:
        manifest["attributes"] = attribute_classes
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
        if attribute_classes:
            manifest["splits"][split]["attributes"] = {}
        for attr, classes in attribute_classes.items():
            values = data.attributes[attr].numpy()[idx].astype(np.int64)
            path = save_npy(out_dir / f"{split}_attr_{attr}.npy", values)
            manifest["splits"][split]["attributes"][attr] = {
                "class_counts": np.bincount(values, minlength=classes).tolist(),
                "sha256": sha256_file(path),
            }
    write_json(out_dir / MANIFEST, manifest)
    return manifest


def read_manifest(data_dir: str | Path) -> dict:
    """The manifest of a prepared folder (FileNotFoundError saying how to make it)."""
    data_dir = Path(data_dir)
    if not (data_dir / MANIFEST).is_file():
        raise FileNotFoundError(f"no prepared dataset at {data_dir} (missing {MANIFEST}); "
                                f"run `gradleak prepare-data --dataset {data_dir.name}` (or "
                                f"snakemake, which re-creates it) first")
    return read_json(data_dir / MANIFEST)


def load_prepared(data_dir: str | Path, split: str, verify: bool = True) -> ImageData:
    """Read one split of a prepared folder, checking it against the manifest."""
    data_dir = Path(data_dir)
    manifest_path = data_dir / MANIFEST
    manifest = read_manifest(data_dir)
    try:
        splits = manifest["splits"]
        entry = splits[split] if split in splits else None
        if entry is not None:
            entry["x_sha256"], entry["y_sha256"], manifest["num_classes"]  # noqa: B018
    except (KeyError, TypeError) as err:
        raise ValueError(f"{manifest_path} is not a prepared-data manifest (bad or missing "
                         f"{err}); {_REPREPARE.format(data_dir)}") from None
    if entry is None:
        raise ValueError(f"split {split!r} not in {data_dir}; expected one of "
                         f"{sorted(splits)}")
    x_path, y_path = data_dir / f"{split}_x.npy", data_dir / f"{split}_y.npy"
    attr_paths = {attr: (data_dir / f"{split}_attr_{attr}.npy", meta["sha256"])
                  for attr, meta in entry.get("attributes", {}).items()}
    if verify:
        checks = [(x_path, entry["x_sha256"]), (y_path, entry["y_sha256"]),
                  *attr_paths.values()]
        for path, digest in checks:
            if not path.is_file():
                raise FileNotFoundError(f"{path} (listed in {manifest_path}) is missing; "
                                        f"{_REPREPARE.format(data_dir)}")
            if sha256_file(path) != digest:
                raise ValueError(f"{path} does not match its manifest sha256; "
                                 f"{_REPREPARE.format(data_dir)}")
    x = torch.from_numpy(_load_npy(x_path))
    y = torch.from_numpy(_load_npy(y_path))
    attributes = {attr: torch.from_numpy(np.load(path)) for attr, (path, _) in attr_paths.items()}
    return ImageData(x, y, manifest["num_classes"], attributes)


def _load_npy(path: Path) -> np.ndarray:
    """An array ``save_npy`` wrote (``allow_pickle=False``: object arrays are refused)."""
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{path} is not a readable .npy array ({err}); "
                         f"{_REPREPARE.format(path.parent)}") from None


def attribute_classes(data_dir: str | Path) -> dict[str, int]:
    """Attribute name -> class count of a prepared folder (empty: no attributes)."""
    return dict(read_manifest(data_dir).get("attributes", {}))
