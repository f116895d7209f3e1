"""CelebA with sensitive attributes (RecUP-FL), in torchvision's layout,
``<root>/celeba/img_align_celeba/*.jpg`` with ``list_attr_celeba.txt`` (and
``list_eval_partition.txt`` for a ``split``), center-cropped to 178x178 and resized to
``size`` (32); the first ``max_images`` of the split in file order.

y = Male (gender). Attributes: ``age`` (2: 0 Young, 1 not), ``smiling`` (2),
``eyeglasses`` (2). Read directly in that layout (torchvision's CelebA also md5-checks the
identity, bounding-box and landmark files it does not need here).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradleak.data.image_data import ImageData, resize_crops

CELEBA_SPLITS = {"train": 0, "valid": 1, "test": 2, "all": None}


def _celeba_table(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """list_attr_celeba.txt: (attribute names, file names, (N, 40) values in {-1, 1})."""
    with open(path) as fh:
        lines = fh.read().splitlines()
    names = lines[1].split()
    files, values = [], []
    for number, line in enumerate(lines[2:], 3):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != len(names) + 1:
            raise ValueError(f"{path}:{number}: expected a file name and {len(names)} values, "
                             f"got {len(fields)} fields")
        files.append(fields[0])
        values.append([int(v) for v in fields[1:]])
    return names, files, np.array(values, dtype=np.int64).reshape(-1, len(names))


def celeba_missing(options: dict) -> str | None:
    """Why CelebA cannot be read from its local root (None: it can)."""
    root = Path(options.get("root", "data"))
    base = root / "celeba"
    needed = [base / "img_align_celeba", base / "list_attr_celeba.txt"]
    if options.get("split", "all") != "all":
        needed.append(base / "list_eval_partition.txt")
    if absent := [str(p) for p in needed if not p.exists()]:
        return (f"dataset 'celeba' not found: {', '.join(absent)} missing; put CelebA's "
                f"img_align_celeba/ (from img_align_celeba.zip), list_attr_celeba.txt and "
                f"list_eval_partition.txt in {base} as torchvision's CelebA lays them out "
                f"(mmlab.ie.cuhk.edu.hk/projects/CelebA.html), or set datasets.celeba.root")
    return None


def load_celeba(root: str | Path, split: str = "all", size: int = 32,
                max_images: int = 50000) -> ImageData:
    """CelebA with y = male and attributes age, smiling, eyeglasses (module docstring)."""
    from PIL import Image

    if split not in CELEBA_SPLITS:
        raise ValueError(f"celeba split must be one of {sorted(CELEBA_SPLITS)}, got {split!r}")
    if max_images < 1 or size < 8:
        raise ValueError(f"celeba needs max_images >= 1 and size >= 8, got {max_images}, {size}")
    if reason := celeba_missing({"root": root, "split": split}):
        raise FileNotFoundError(reason)
    base = Path(root) / "celeba"
    names, files, values = _celeba_table(base / "list_attr_celeba.txt")
    if absent := [c for c in ("Male", "Young", "Smiling", "Eyeglasses") if c not in names]:
        raise ValueError(f"{base / 'list_attr_celeba.txt'} lacks attribute(s) {absent}")
    keep = np.arange(len(files))
    if CELEBA_SPLITS[split] is not None:
        with open(base / "list_eval_partition.txt") as fh:
            partition = dict(line.split() for line in fh if line.strip())
        keep = np.array([i for i, f in enumerate(files)
                         if int(partition.get(f, -1)) == CELEBA_SPLITS[split]], dtype=np.int64)
    keep = keep[:max_images]
    if not len(keep):
        raise ValueError(f"celeba: no image of split {split!r} in {base}")

    def crops():
        for i in keep:
            path = base / "img_align_celeba" / files[i]
            with Image.open(path) as image:
                array = np.asarray(image.convert("RGB"))
            if array.shape[:2] != (218, 178):
                raise ValueError(f"celeba: {path} is {array.shape[1]}x{array.shape[0]}; expected "
                                 f"the aligned 178x218")
            yield torch.from_numpy(array[20:198].copy()).permute(2, 0, 1)  # central 178x178

    x = resize_crops(crops(), (size, size))
    column = {n: (values[keep, i] > 0).astype(np.int64) for i, n in enumerate(names)}
    attributes = {"age": 1 - column["Young"], "smiling": column["Smiling"],
                  "eyeglasses": column["Eyeglasses"]}
    return ImageData(x.contiguous(), torch.from_numpy(column["Male"]), 2,
                     {k: torch.from_numpy(v) for k, v in attributes.items()})
