"""Datasets with a task label ``y`` and sensitive attributes (RecUP-FL's attribute inference).

Every loader returns :class:`ImageData` whose ``attributes`` maps a name to (N,) int64
classes ``0..k-1`` (``CLASSES`` lists k per dataset). Nothing is downloaded: a local
dataset that is not there fails before any work with one message naming the path and
how to obtain it (:func:`missing`).

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
- ``adult``: UCI Adult Income from a local folder holding UCI's ``adult.data`` (32,561
  rows) and ``adult.test`` (16,281 rows). y = income > 50K. Attributes: ``race`` (5: 0
  White, 1 Asian-Pac-Islander, 2 Amer-Indian-Eskimo, 3 Black, 4 Other; the paper's five)
  and ``sex`` (2: 0 Female, 1 Male). Features: the six continuous columns min-max scaled
  to [0, 1] over the loaded rows, then the categorical columns one-hot over adult.names'
  categories ('?' is a category of workclass, occupation and native-country, so no row is
  dropped); the columns in ``drop`` (default race, as the paper's 103 inputs) are left
  out. Stored as x of shape (N, 1, 1, F), F = 103 by default.
- ``lfw``: Labeled Faces in the Wild in torchvision's LFWPeople layout,
  ``<root>/lfw-py/lfw_funneled/<Name>/<Name>_<NNNN>.jpg`` (``image_set``), plus the
  public attribute scores of Kumar et al. (``<root>/lfw-py/lfw_attributes.txt``; only
  the images it scores). Images: scikit-learn's ``fetch_lfw_people`` crop (rows 70:195,
  columns 78:172 of the 250x250 image) halved to 3x62x47, the paper's shape. y = Smiling
  > 0. Attributes, each the arg-max of the file's columns: ``race`` (3: Asian, White,
  Black), ``age`` (5: Baby, Child, Youth, Middle Aged, Senior), ``glasses`` (3: No
  Eyewear, Eyeglasses, Sunglasses), ``hair`` (4: Black Hair, Blond Hair, Brown Hair,
  Bald); ``gender`` (2: Male > 0); ``identity``, the person (index of the name in sorted
  order; in ``GROUPS``, not ``CLASSES``: a client partition groups by it, RecUP-FL §6.4,
  and the attribute track does not infer it). The folder is read directly: torchvision's LFWPeople
  would also need the .tgz archive (md5-checked) and its people lists beside it.
- ``celeba``: CelebA in torchvision's layout, ``<root>/celeba/img_align_celeba/*.jpg``
  with ``list_attr_celeba.txt`` (and ``list_eval_partition.txt`` for a ``split``),
  center-cropped to 178x178 and resized to ``size`` (32); the first ``max_images`` of the
  split in file order. y = Male (gender). Attributes: ``age`` (2: 0 Young, 1 not),
  ``smiling`` (2), ``eyeglasses`` (2). Read directly in that layout (torchvision's CelebA
  also md5-checks the identity, bounding-box and landmark files it does not need here).
- ``audiomnist``: AudioMNIST's ``<root>/data/<speaker>/<digit>_<speaker>_<index>.wav``
  and ``<root>/data/audioMNIST_meta.txt``. Each recording is resampled to 8 kHz,
  centered in 1 s (zero-padded or cut), and turned into a ``size`` x ``size`` (64)
  log-magnitude spectrogram (``torch.stft``, Hann window, n_fft 2*size-2, hop 8000 //
  size; dB relative to the clip's peak, floor -80 dB, mapped to [0, 1]; low frequencies
  at the bottom). y = digit. Attributes: ``gender`` (2: 0 female, 1 male), ``native``
  (2: 1 where "native speaker" is "yes"), ``identity`` (4, the paper's: 0 male native, 1 female
  native, 2 male non-native, 3 female non-native), ``accent`` (2: 0 German, 1 other),
  ``age`` (3: < 25, 25-29, >= 30; an age outside 10-100, speaker 45's '1234', counts as
  the speakers' median).

Stand-ins (``stand_in``) give each of these the paper's shape (``datasets.SHAPES``), task
class count and attribute classes from the digits: ``digits`` ranks five shape measures
(ink, slant, stroke width, bounding-box aspect, vertical centroid) within each digit into
k bins, so every attribute is balanced and independent of y (y: parity for two classes,
the digit for ten; ``mnist_attributes``' stand-in is the parity task whatever ``task``
says), and a ``GROUPS`` attribute (LFW's ``identity``) is each distinct combination of the
binned attributes, so a stand-in "person" has one race, gender, age... as a real one has;
``fake`` draws seeded noise for x, y and the attributes (a group: one of N / 10).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedleak.data.datasets import SHAPES, ImageData, load_digits, load_mnist, to_channels

DIGIT_ATTRIBUTES = {"ink": 3, "slant": 3, "stroke": 3, "group": 2}
CLASSES: dict[str, dict[str, int]] = {  # dataset -> attribute -> class count
    "digits": {a: DIGIT_ATTRIBUTES[a] for a in ("ink", "slant", "stroke")},  # y: the digit
    "digits_attributes": DIGIT_ATTRIBUTES,
    "mnist_attributes": DIGIT_ATTRIBUTES,
    "adult": {"race": 5, "sex": 2},
    "lfw": {"race": 3, "gender": 2, "age": 5, "glasses": 3, "hair": 4},
    "celeba": {"age": 2, "smiling": 2, "eyeglasses": 2},
    "audiomnist": {"gender": 2, "native": 2, "identity": 4, "accent": 2, "age": 3},
}
TASKS = {"parity": 2, "digit": 10}
# dataset -> attributes that group samples rather than being inferred (not in CLASSES; the
# attribute track leaves them alone): a client partition of kind `attribute` reads them
GROUPS: dict[str, tuple[str, ...]] = {"lfw": ("identity",)}

# --- digits and MNIST ------------------------------------------------------------------


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


def load_mnist_attributes(root: str | Path, split: str = "test",
                          task: str = "parity") -> ImageData:
    """MNIST (local root, as ``load_mnist``) with y = ``task`` and the digit attributes."""
    if reason := missing("mnist_attributes", {"root": root, "split": split}):
        raise FileNotFoundError(reason)
    mnist = load_mnist(root, split)
    y, classes = _task(mnist.y, task)
    return ImageData(mnist.x, y, classes, digit_attributes(mnist.x, mnist.y))


# --- Adult -----------------------------------------------------------------------------

ADULT_COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
                 "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
                 "hours-per-week", "native-country", "income")
ADULT_CONTINUOUS = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss",
                    "hours-per-week")
# adult.names' categories; '?' (a missing value in UCI's files) is a category of its own
ADULT_CATEGORIES = {
    "workclass": ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
                  "State-gov", "Without-pay", "Never-worked", "?"),
    "education": ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm",
                  "Assoc-voc", "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th",
                  "Doctorate", "5th-6th", "Preschool"),
    "marital-status": ("Married-civ-spouse", "Divorced", "Never-married", "Separated",
                       "Widowed", "Married-spouse-absent", "Married-AF-spouse"),
    "occupation": ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                   "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                   "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
                   "Armed-Forces", "?"),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative",
                     "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Black", "Other"),
    "sex": ("Female", "Male"),
    "native-country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
        "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba",
        "Iran", "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico",
        "Portugal", "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan",
        "Haiti", "Columbia", "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand",
        "Yugoslavia", "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands",
        "?"),
}
ADULT_FILES = {"all": ("adult.data", "adult.test"), "train": ("adult.data",),
               "test": ("adult.test",)}


def adult_feature_names(drop: tuple[str, ...] | list[str] = ("race",)) -> list[str]:
    """The names of x's F columns: continuous ones, then ``column=category``."""
    _check_drop(drop)
    names = [c for c in ADULT_CONTINUOUS if c not in drop]
    for column, categories in ADULT_CATEGORIES.items():
        if column not in drop:
            names += [f"{column}={c}" for c in categories]
    return names


def _check_drop(drop) -> None:
    droppable = set(ADULT_CONTINUOUS) | set(ADULT_CATEGORIES)
    if unknown := sorted(set(drop) - droppable):
        raise ValueError(f"adult: cannot drop {unknown}; expected columns among "
                         f"{sorted(droppable)}")


def _read_adult(path: Path) -> list[list[str]]:
    rows = []
    with open(path) as fh:
        for number, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("|"):  # adult.test's first line: |1x3 Cross validator
                continue
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != len(ADULT_COLUMNS):
                raise ValueError(f"{path}:{number}: expected {len(ADULT_COLUMNS)} comma-separated "
                                 f"fields (UCI adult format), got {len(fields)}")
            fields[-1] = fields[-1].rstrip(".")  # adult.test writes '>50K.'
            rows.append(fields)
    return rows


def load_adult(root: str | Path, split: str = "all",
               drop: tuple[str, ...] | list[str] = ("race",)) -> ImageData:
    """UCI Adult from ``root`` (adult.data, adult.test): see the module docstring."""
    if split not in ADULT_FILES:
        raise ValueError(f"adult split must be one of {sorted(ADULT_FILES)}, got {split!r}")
    _check_drop(drop)
    if reason := missing("adult", {"root": root, "split": split}):
        raise FileNotFoundError(reason)
    rows = [r for name in ADULT_FILES[split] for r in _read_adult(Path(root) / name)]
    if not rows:
        raise ValueError(f"adult: no rows in {[str(Path(root) / n) for n in ADULT_FILES[split]]}")
    column = {c: [r[i] for r in rows] for i, c in enumerate(ADULT_COLUMNS)}

    def codes(name: str) -> np.ndarray:
        index = {c: i for i, c in enumerate(ADULT_CATEGORIES[name])}
        if bad := sorted(set(column[name]) - set(index)):
            raise ValueError(f"adult: unknown {name} value(s) {bad[:5]} under {root}; expected "
                             f"one of {list(index)}")
        return np.array([index[v] for v in column[name]], dtype=np.int64)

    parts = []
    for name in ADULT_CONTINUOUS:
        if name in drop:
            continue
        try:
            values = np.array(column[name], dtype=np.float64)
        except ValueError as exc:
            raise ValueError(f"adult: column {name} under {root} is not numeric ({exc})") from None
        low, span = values.min(), values.max() - values.min()
        parts.append(((values - low) / (span if span > 0 else 1.0))[:, None])
    for name, categories in ADULT_CATEGORIES.items():
        if name not in drop:
            parts.append(np.eye(len(categories))[codes(name)])
    x = torch.from_numpy(np.concatenate(parts, axis=1).astype(np.float32))
    labels = column["income"]
    if bad := sorted(set(labels) - {">50K", "<=50K"}):
        raise ValueError(f"adult: unknown income value(s) {bad[:5]}; expected '>50K' or '<=50K'")
    y = torch.tensor([label == ">50K" for label in labels], dtype=torch.int64)
    attributes = {"race": torch.from_numpy(codes("race")), "sex": torch.from_numpy(codes("sex"))}
    return ImageData(x.view(len(rows), 1, 1, -1).contiguous(), y, 2, attributes)


# --- LFW -------------------------------------------------------------------------------

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


def _resized(crops: Iterable[torch.Tensor], size: tuple[int, int],
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


def load_lfw(root: str | Path, image_set: str = "funneled") -> ImageData:
    """LFW with y = smiling and the attributes of ``lfw_attributes.txt`` (module docstring)."""
    from PIL import Image

    if image_set not in LFW_IMAGE_SETS:
        raise ValueError(f"lfw image_set must be one of {sorted(LFW_IMAGE_SETS)}, "
                         f"got {image_set!r}")
    if reason := missing("lfw", {"root": root, "image_set": image_set}):
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

    x = _resized(crops(), LFW_SHAPE)
    attributes = {name: torch.from_numpy(np.stack([scores[c] for c in columns], 1).argmax(1))
                  for name, columns in LFW_GROUPS.items()}
    attributes["gender"] = torch.from_numpy((scores["Male"] > 0).astype(np.int64))
    y = torch.from_numpy((scores["Smiling"] > 0).astype(np.int64))
    kept = {k: attributes[k] for k in CLASSES["lfw"]}
    names = sorted(set(people))
    index = {name: i for i, name in enumerate(names)}
    kept["identity"] = torch.tensor([index[p] for p in people], dtype=torch.int64)
    return ImageData(x.contiguous(), y, 2, kept)


# --- CelebA ----------------------------------------------------------------------------

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


def load_celeba(root: str | Path, split: str = "all", size: int = 32,
                max_images: int = 50000) -> ImageData:
    """CelebA with y = male and attributes age, smiling, eyeglasses (module docstring)."""
    from PIL import Image

    if split not in CELEBA_SPLITS:
        raise ValueError(f"celeba split must be one of {sorted(CELEBA_SPLITS)}, got {split!r}")
    if max_images < 1 or size < 8:
        raise ValueError(f"celeba needs max_images >= 1 and size >= 8, got {max_images}, {size}")
    if reason := missing("celeba", {"root": root, "split": split}):
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

    x = _resized(crops(), (size, size))
    column = {n: (values[keep, i] > 0).astype(np.int64) for i, n in enumerate(names)}
    attributes = {"age": 1 - column["Young"], "smiling": column["Smiling"],
                  "eyeglasses": column["Eyeglasses"]}
    return ImageData(x.contiguous(), torch.from_numpy(column["Male"]), 2,
                     {k: torch.from_numpy(v) for k, v in attributes.items()})


# --- AudioMNIST ------------------------------------------------------------------------

AUDIO_RATE = 8000
WAV_NAME = re.compile(r"(\d)_(\d+)_(\d+)\.wav")


def one_second(wave: np.ndarray, rate: int) -> np.ndarray:
    """A mono recording resampled to 8 kHz and centered in 1 s (zero-padded or cut)."""
    from scipy.signal import resample_poly

    wave = np.asarray(wave, dtype=np.float64)
    if wave.ndim != 1 or len(wave) == 0:
        raise ValueError(f"expected a non-empty mono recording, got shape {wave.shape}")
    if rate != AUDIO_RATE:
        g = math.gcd(AUDIO_RATE, rate)
        wave = resample_poly(wave, AUDIO_RATE // g, rate // g)
    start = (len(wave) - AUDIO_RATE) // 2
    if start >= 0:
        return wave[start:start + AUDIO_RATE]
    return np.pad(wave, (-start, AUDIO_RATE - len(wave) + start))


def spectrograms(waves: torch.Tensor, size: int = 64) -> torch.Tensor:
    """(B, size, size) log-magnitude spectrograms in [0, 1] of 1 s clips at 8 kHz (B, 8000):
    n_fft 2*size-2, hop 8000 // size, dB relative to each clip's peak, floor -80 dB."""
    n_fft, hop = 2 * size - 2, AUDIO_RATE // size
    stft = torch.stft(waves.double(), n_fft, hop_length=hop, return_complex=True,
                      window=torch.hann_window(n_fft, dtype=torch.float64))
    magnitude = stft.abs()[:, :, :size]
    peak = magnitude.amax((1, 2), keepdim=True).clamp_min(1e-12)
    db = 20 * torch.log10(magnitude / peak + 1e-12)
    return ((db.clamp(min=-80.0) + 80.0) / 80.0).flip(1).float()


def spectrogram(wave: np.ndarray, rate: int, size: int = 64) -> torch.Tensor:
    """(size, size) spectrogram in [0, 1] of one mono recording (module docstring)."""
    return spectrograms(torch.from_numpy(one_second(wave, rate))[None], size)[0]


def read_audiomnist_meta(path: str | Path) -> dict[str, dict]:
    """audioMNIST_meta.txt (a JSON object: speaker '01'..'60' -> accent, age, gender, ...)."""
    import ast

    text = Path(path).read_text()
    try:
        meta = json.loads(text)
    except json.JSONDecodeError:
        meta = ast.literal_eval(text)
    if not isinstance(meta, dict) or not meta:
        raise ValueError(f"{path}: expected a speaker -> metadata mapping")
    return meta


def _speaker_attributes(meta: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Speaker -> attribute classes (module docstring)."""
    def plausible(age) -> float | None:
        try:
            value = float(age)
        except (TypeError, ValueError):
            return None
        return value if 10 <= value <= 100 else None

    ages = {s: plausible(m.get("age")) for s, m in meta.items()}
    median = float(np.median([a for a in ages.values() if a is not None] or [30.0]))
    out = {}
    for speaker, info in meta.items():
        gender, native = str(info["gender"]).strip().lower(), str(info["native speaker"])
        if gender not in ("female", "male"):
            raise ValueError(f"audiomnist: speaker {speaker} has gender {gender!r}; expected "
                             f"'female' or 'male'")
        male, is_native = int(gender == "male"), int(native.strip().lower() == "yes")
        age = ages[speaker] if ages[speaker] is not None else median
        out[speaker] = {"gender": male, "native": is_native,
                        "identity": (1 - is_native) * 2 + (1 - male),
                        "accent": int(str(info.get("accent", "")).strip().lower() != "german"),
                        "age": 0 if age < 25 else (1 if age < 30 else 2)}
    return out


def load_audiomnist(root: str | Path, size: int = 64) -> ImageData:
    """AudioMNIST spectrograms (1, size, size), y = digit, speaker attributes (module doc)."""
    from scipy.io import wavfile

    if size < 8:
        raise ValueError(f"audiomnist size must be >= 8, got {size}")
    if reason := missing("audiomnist", {"root": root}):
        raise FileNotFoundError(reason)
    data_dir = Path(root) / "data"
    speakers = _speaker_attributes(read_audiomnist_meta(data_dir / "audioMNIST_meta.txt"))
    images, waves, digits, rows = [], [], [], []
    for folder in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("*.wav")):
            match = WAV_NAME.fullmatch(path.name)
            if not match:
                raise ValueError(f"audiomnist: {path} is not named <digit>_<speaker>_<index>.wav")
            speaker = match.group(2)
            if speaker not in speakers:
                raise ValueError(f"audiomnist: speaker {speaker!r} of {path} is not in "
                                 f"{data_dir / 'audioMNIST_meta.txt'}")
            rate, wave = wavfile.read(path)
            if wave.ndim == 2:
                wave = wave.mean(1)
            waves.append(torch.from_numpy(one_second(wave, rate)))
            digits.append(int(match.group(1)))
            rows.append(speakers[speaker])
            if len(waves) == 1024:  # a batched STFT, 1024 clips in memory at a time
                images.append(spectrograms(torch.stack(waves), size))
                waves = []
    if waves:
        images.append(spectrograms(torch.stack(waves), size))
    if not images:
        raise FileNotFoundError(f"audiomnist: no <speaker>/*.wav under {data_dir}")
    attributes = {name: torch.tensor([r[name] for r in rows], dtype=torch.int64)
                  for name in CLASSES["audiomnist"]}
    return ImageData(torch.cat(images).unsqueeze(1).contiguous(),
                     torch.tensor(digits, dtype=torch.int64), 10, attributes)


# --- what is missing, stand-ins, dispatch ----------------------------------------------

def missing(name: str, options: dict) -> str | None:
    """Why attribute dataset ``name`` cannot be read from its local root (None: it can)."""
    if name == "digits_attributes":
        return None
    root = Path(options.get("root", "data"))
    if name == "mnist_attributes":
        raw = root / "MNIST" / "raw"
        prefix = "t10k" if options.get("split", "test") == "test" else "train"
        if all(any((raw / f"{prefix}-{kind}-idx{d}-ubyte{gz}").is_file() for gz in ("", ".gz"))
               for kind, d in (("images", 3), ("labels", 1))):
            return None
        return (f"dataset 'mnist_attributes' not found at {raw}: put the MNIST idx files "
                f"({prefix}-images-idx3-ubyte(.gz), {prefix}-labels-idx1-ubyte(.gz)) there, e.g. "
                f"with torchvision.datasets.MNIST(root, download=True) where a network is "
                f"available, or set datasets.mnist_attributes.root")
    if name == "adult":
        files = [root / f for f in ADULT_FILES.get(options.get("split", "all"), ("adult.data",))]
        if absent := [str(f) for f in files if not f.is_file()]:
            return (f"dataset 'adult' not found: {', '.join(absent)} missing; put UCI's Adult "
                    f"files (adult.data, adult.test from archive.ics.uci.edu/dataset/2/adult, "
                    f"unchanged) in {root} or set datasets.adult.root")
        return None
    if name == "lfw":
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
    if name == "celeba":
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
    if name == "audiomnist":
        data_dir = root / "data"
        meta = data_dir / "audioMNIST_meta.txt"
        if meta.is_file() and any(data_dir.glob("*/*.wav")):
            return None
        return (f"dataset 'audiomnist' not found: expected {meta} and "
                f"{data_dir}/<speaker>/<digit>_<speaker>_<index>.wav; clone "
                f"github.com/soerenab/AudioMNIST (its data/ folder) into {root} or set "
                f"datasets.audiomnist.root")
    raise ValueError(f"unknown attribute dataset {name!r}; expected one of {sorted(CLASSES)}")


def stand_in(name: str, kind: str, seed: int = 0) -> ImageData:
    """Bundled data in the shape, task classes and attribute classes of ``name`` (smoke runs):
    ``digits`` (balanced attributes independent of y) or ``fake`` (seeded noise)."""
    if name not in CLASSES or name not in SHAPES:
        raise ValueError(f"no attribute stand-in for {name!r}; expected one of "
                         f"{sorted(set(CLASSES) & set(SHAPES))}")
    channels, height, width, classes = SHAPES[name]
    if kind == "fake":
        g = torch.Generator().manual_seed(seed)
        count = 1000
        x = torch.rand(count, channels, height, width, generator=g)
        y = torch.randint(classes, (count,), generator=g)
        attributes = {a: torch.randint(k, (count,), generator=g) for a, k in CLASSES[name].items()}
        attributes |= {a: torch.randint(count // 10, (count,), generator=g)
                       for a in GROUPS.get(name, ())}
        return ImageData(x, y, classes, attributes)
    if kind != "digits":
        raise ValueError(f"stand_in must be 'digits' or 'fake', got {kind!r}")
    digits = load_digits(1, 32)
    gray, labels = _gray(digits.x), digits.y.numpy()
    measures = [ink_mass(gray), slant(gray), stroke_width(gray), _aspect(gray),
                _centroid_row(gray)]
    attributes = {a: torch.from_numpy(within_class_bins(measures[i % len(measures)], labels, k))
                  for i, (a, k) in enumerate(CLASSES[name].items())}
    for group in GROUPS.get(name, ()):  # a "person": one combination of the attributes
        combos = torch.stack([attributes[a] for a in CLASSES[name]], 1)
        attributes[group] = torch.unique(combos, dim=0, return_inverse=True)[1]
    y = digits.y % 2 if classes == 2 else digits.y % classes
    if height == 1:  # tabular rows: the 32x32 image averaged into ``width`` features
        x = F.adaptive_avg_pool1d(digits.x.flatten(1).unsqueeze(1), width)
        x = x.view(len(digits), 1, 1, width)
    else:
        x = F.interpolate(digits.x, size=(height, width), mode="bilinear", align_corners=False)
        x = to_channels(x, channels)
    return ImageData(x.clamp(0, 1).contiguous(), y, classes, attributes)


LOADERS = {"digits_attributes": load_digits_attributes, "mnist_attributes": load_mnist_attributes,
           "adult": load_adult, "lfw": load_lfw, "celeba": load_celeba,
           "audiomnist": load_audiomnist}
