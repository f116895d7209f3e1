"""Labeled Faces in the Wild with sensitive attributes (RecUP-FL), in torchvision's
LFWPeople layout, ``<root>/lfw-py/lfw_funneled/<Name>/<Name>_<NNNN>.jpg`` (``image_set``),
plus the public attribute scores of Kumar et al. (``<root>/lfw-py/lfw_attributes.txt``;
only the images it scores).

Images: scikit-learn's ``fetch_lfw_people`` crop (rows 70:195, columns 78:172 of the
250x250 image) halved to 3x62x47, the paper's shape. y = Smiling > 0. Attributes, each the
arg-max of the file's columns: ``race`` (3: Asian, White, Black), ``age`` (5: Baby, Child,
Youth, Middle Aged, Senior), ``glasses`` (3: No Eyewear, Eyeglasses, Sunglasses), ``hair``
(4: Black Hair, Blond Hair, Brown Hair, Bald); ``gender`` (2: Male > 0); ``identity``, the
person (index of the name in sorted order; in ``attributes.GROUPS``, not ``LFW_CLASSES``: a
client partition groups by it, RecUP-FL §6.4, and the attribute track does not infer it). The
folder is read directly: torchvision's LFWPeople would also need the .tgz archive
(md5-checked) and its people lists beside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gradleak.data.attribute_counts import LFW_CLASSES
from gradleak.data.image_data import ImageData, resize_crops

LFW_IMAGE_SETS = {"original": "lfw", "funneled": "lfw_funneled",
                  "deepfunneled": "lfw-deepfunneled"}  # torchvision's folder names
LFW_GROUPS = {"race": ("Asian", "White", "Black"),
              "age": ("Baby", "Child", "Youth", "Middle Aged", "Senior"),
              "glasses": ("No Eyewear", "Eyeglasses", "Sunglasses"),
              "hair": ("Black Hair", "Blond Hair", "Brown Hair", "Bald")}
LFW_SHAPE = (62, 47)
LFW_CROP = (slice(70, 195), slice(78, 172))  # scikit-learn's fetch_lfw_people


def read_lfw_attributes(path: str | Path) -> tuple[list[str], list[int], dict[str, np.ndarray]]:
    """``lfw_attributes.txt``: (person names, image numbers, column name -> scores)."""
    header, rows = None, []
    with open(path) as fh:
        for number, line in enumerate(fh, 1):
            if line.startswith("#"):
                fields = [f.strip() for f in line.lstrip("#").split("\t") if f.strip()]
                if fields[:2] == ["person", "imagenum"]:
                    header = fields
                continue
            if not line.strip():
                continue
            if header is None:
                raise ValueError(f"{path}:{number}: data before the '#\\tperson\\timagenum\\t...' "
                                 f"header line")
            fields = line.rstrip().split("\t")
            if len(fields) != len(header):
                raise ValueError(f"{path}:{number}: expected {len(header)} tab-separated fields "
                                 f"like the header, got {len(fields)}")
            rows.append(fields)
    if header is None or not rows:
        raise ValueError(f"{path}: no '#\\tperson\\timagenum\\t...' header or no rows")
    scores = np.array([r[2:] for r in rows], dtype=np.float64)
    return ([r[0] for r in rows], [int(r[1]) for r in rows],
            {name: scores[:, i] for i, name in enumerate(header[2:])})


def lfw_missing(options: dict) -> str | None:
    """Why LFW cannot be read from its local root (None: it can)."""
    root = Path(options.get("root", "data"))
    base = root / "lfw-py"
    images = base / LFW_IMAGE_SETS.get(options.get("image_set", "funneled"), "lfw_funneled")
    absent = [str(p) for p, ok in ((images, images.is_dir()),
                                   (base / "lfw_attributes.txt",
                                    (base / "lfw_attributes.txt").is_file())) if not ok]
    if absent:
        return (f"dataset 'lfw' not found: {', '.join(absent)} missing; extract LFW "
                f"(vis-www.cs.umass.edu/lfw: lfw-funneled.tgz, or the deep-funneled/original "
                f"set for image_set) into {base} as torchvision's LFWPeople lays it out "
                f"({images}/<Name>/<Name>_0001.jpg) and put Kumar et al.'s attribute "
                f"scores lfw_attributes.txt (www.cs.columbia.edu/CAVE/databases/pubfig/"
                f"download/) beside it, or set datasets.lfw.root")
    return None


def load_lfw(root: str | Path, image_set: str = "funneled") -> ImageData:
    """LFW with y = smiling and the attributes of ``lfw_attributes.txt`` (module docstring)."""
    from PIL import Image

    if image_set not in LFW_IMAGE_SETS:
        raise ValueError(f"lfw image_set must be one of {sorted(LFW_IMAGE_SETS)}, "
                         f"got {image_set!r}")
    if reason := lfw_missing({"root": root, "image_set": image_set}):
        raise FileNotFoundError(reason)
    base = Path(root) / "lfw-py"
    people, numbers, scores = read_lfw_attributes(base / "lfw_attributes.txt")
    needed = ["Smiling", "Male", *(c for group in LFW_GROUPS.values() for c in group)]
    if absent := [c for c in needed if c not in scores]:
        raise ValueError(f"{base / 'lfw_attributes.txt'} lacks column(s) {absent}")
    paths = []
    for person, number in zip(people, numbers):
        folder = person.replace(" ", "_")
        paths.append(base / LFW_IMAGE_SETS[image_set] / folder / f"{folder}_{number:04d}.jpg")
    if absent := [str(p) for p in paths if not p.is_file()]:
        raise FileNotFoundError(f"lfw: {len(absent)} image(s) scored in lfw_attributes.txt are "
                                f"missing, e.g. {absent[:3]}")

    def crops():
        for path in paths:
            with Image.open(path) as image:
                array = np.asarray(image.convert("RGB"))
            if array.shape[:2] != (250, 250):
                raise ValueError(f"lfw: {path} is {array.shape[1]}x{array.shape[0]}; expected "
                                 f"LFW's 250x250")
            yield torch.from_numpy(array[LFW_CROP].copy()).permute(2, 0, 1)

    x = resize_crops(crops(), LFW_SHAPE)
    attributes = {name: torch.from_numpy(np.stack([scores[c] for c in columns], 1).argmax(1))
                  for name, columns in LFW_GROUPS.items()}
    attributes["gender"] = torch.from_numpy((scores["Male"] > 0).astype(np.int64))
    y = torch.from_numpy((scores["Smiling"] > 0).astype(np.int64))
    kept = {k: attributes[k] for k in LFW_CLASSES}
    names = sorted(set(people))
    index = {name: i for i, name in enumerate(names)}
    kept["identity"] = torch.tensor([index[p] for p in people], dtype=torch.int64)
    return ImageData(x.contiguous(), y, 2, kept)
