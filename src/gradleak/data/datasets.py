"""Datasets by name (``load``, ``missing``) as float tensors in [0, 1], shape (N, C, H, W),
with integer labels (what the configuration alone says of them: ``shape``, ``label_count``,
``size``).

- ``digits``: scikit-learn's bundled handwritten digits (``gradleak.data.digits``: 1,797
  images, 8x8, 10 classes), bilinearly upsampled to 32x32; 1 or 3 channels.
  ``load("digits")`` adds the sensitive attributes ``ink``, ``slant`` and ``stroke`` of
  ``digits_attributes`` (terciles within each digit, so independent of the label).
- ``natural``: seeded random 32x32 crops, at several scales, of the photographs
  bundled with scikit-image (``skimage.data``); label = index of the photograph.
- ``mnist``: the MNIST idx files (``gradleak.data.digits``) read with torchvision's readers
  from a local root laid out as torchvision does (``<root>/MNIST/raw/``).
- ``cifar10``, ``cifar100``, ``svhn``: torchvision's datasets from a local root,
  downloaded by torchvision only when ``download`` is set.
- ``imagenet``, ``tinyimagenet``, ``ffhq``: a local folder in torchvision's ImageFolder
  layout, ``<root>/<split>/<class>/<image>``, center-cropped and resized to ``size``
  (the first ``max_images`` in folder order).

- ``digits_attributes``, ``mnist_attributes``, ``adult``, ``lfw``, ``celeba``,
  ``audiomnist``: a task label and sensitive attributes (RecUP-FL), loaded by
  ``gradleak.data.attributes`` (see there).

Smoke runs replace a paper dataset by a stand-in of its image shape (``SHAPES``; an image
folder's ``size``) and class count (``stand_in``): ``digits`` (the bundled digits resized,
labels kept) or ``fake`` (torchvision's FakeData: seeded noise, for shapes only), its
first ``max_images`` where the dataset has that key. An attribute dataset's stand-in also
carries its attributes (``attributes.stand_in``).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gradleak.data import attributes
from gradleak.data.digit_attributes import digit_attributes
from gradleak.data.digits import DIGITS_COUNT, load_digits, load_mnist
from gradleak.data.image_data import SHAPES, ImageData, to_channels

ATTRIBUTE_DATASETS = ("digits_attributes", "mnist_attributes", "adult", "lfw", "celeba",
                      "audiomnist")  # gradleak.data.attributes
DATASETS = ("digits", "natural", "mnist", "cifar10", "cifar100", "svhn", "imagenet",
            "tinyimagenet", "ffhq", *ATTRIBUTE_DATASETS)
IMAGE_FOLDERS = {"imagenet": 1000, "tinyimagenet": 200, "ffhq": 10}  # classes
TORCHVISION = {"cifar10": ("CIFAR10", "cifar-10-batches-py"),
               "cifar100": ("CIFAR100", "cifar-100-python"), "svhn": ("SVHN", "svhn")}
STAND_IN_SIZE = 1000
NATURAL_PHOTOS = (
    "astronaut", "brick", "camera", "cat", "coffee", "coins", "grass", "gravel",
    "hubble_deep_field", "immunohistochemistry", "moon", "retina", "rocket", "text",
)


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
        for short_side in sorted({max(side, size) for side in (48, 96, 192)}):
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


def load_torchvision(name: str, root: str | Path, split: str = "train",
                     download: bool = False, max_images: int | None = None) -> ImageData:
    """CIFAR-10, CIFAR-100 or SVHN through torchvision, as float tensors in [0, 1] (the
    split's first ``max_images``; None: all)."""
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
    images, labels = images[:max_images], labels[:max_images]
    x = torch.from_numpy(np.ascontiguousarray(images)).float() / 255.0
    classes = 100 if name == "cifar100" else 10
    return ImageData(x, torch.as_tensor(np.asarray(labels), dtype=torch.int64), classes)


def load_image_folder(name: str, root: str | Path, split: str = "val", size: int = 64,
                      max_images: int = 50000) -> ImageData:
    """``<root>/<split>/<class>/*`` through torchvision's ImageFolder, center-cropped to a
    square and resized to ``size``; labels are the class folders in sorted order."""
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    folder = Path(root) / split
    if not folder.is_dir():
        raise FileNotFoundError(f"{name}: no folder {folder}; expected torchvision's ImageFolder "
                                f"layout <root>/<split>/<class>/<image> (datasets.{name}.root)")
    prepare = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size),
                                  transforms.PILToTensor()])
    try:
        dataset = ImageFolder(str(folder), transform=prepare)
    except (FileNotFoundError, OSError) as err:  # no class folders, or none with images
        raise FileNotFoundError(f"{name}: {err} Expected torchvision's ImageFolder layout "
                                f"{folder}/<class>/<image> (datasets.{name}.root, "
                                f"datasets.{name}.split)") from None
    count = min(len(dataset), max_images)

    def item(i: int) -> tuple:
        try:
            return dataset[i]
        except OSError as err:  # PIL: truncated file, not an image
            raise ValueError(f"{name}: cannot read image {dataset.samples[i][0]} ({err}); "
                             f"replace or delete it") from None

    images, labels = zip(*(item(i) for i in range(count)))
    x = torch.stack(images).float() / 255.0
    return ImageData(x, torch.as_tensor(labels, dtype=torch.int64),
                     max(IMAGE_FOLDERS[name], len(dataset.classes)))


# Images in each split of the datasets whose size is fixed (an image folder's: its
# max_images; an attribute dataset's: checked when it is prepared)
SIZES = {"digits": DIGITS_COUNT, "mnist": {"train": 60000, "test": 10000},
         "cifar10": {"train": 50000, "test": 10000}, "cifar100": {"train": 50000, "test": 10000},
         "svhn": {"train": 73257, "test": 26032}}


def size(name: str, spec: dict) -> int | None:
    """Images a configured image dataset holds (an upper bound where it depends on a
    folder; None: not known before it is prepared)."""
    if name in ATTRIBUTE_DATASETS and spec.get("stand_in"):  # the digits, or seeded noise
        count = DIGITS_COUNT if spec["stand_in"] == "digits" else attributes.FAKE_COUNT
        return min(count, spec.get("max_images", count))
    if name in ATTRIBUTE_DATASETS or name not in DATASETS:
        return None
    if spec.get("stand_in") == "natural":  # as many crops as asked for
        return spec.get("max_images", STAND_IN_SIZE)
    if spec.get("stand_in"):
        count = DIGITS_COUNT if spec["stand_in"] == "digits" else STAND_IN_SIZE
        return min(count, spec.get("max_images", count))
    if name == "natural":
        return spec["count"]
    sizes = SIZES.get(name)
    known = sizes.get(spec.get("split", "train")) if isinstance(sizes, dict) else sizes
    limits = [n for n in (known, spec.get("max_images")) if n is not None]
    return min(limits) if limits else None


def shape(name: str, spec: dict) -> tuple[tuple[int, int, int], int]:
    """(C, H, W) and classes of a configured dataset before it is prepared: the digits'
    and the crops' from their options, the others' ``SHAPES`` (an image folder's side, and
    a real CelebA's or AudioMNIST's, its ``size``; an attribute task's classes its
    ``task``)."""
    if name in ("digits", "natural", "digits_attributes"):
        c, h, w = spec.get("channels", 1), spec.get("size", 32), spec.get("size", 32)
        classes = len(NATURAL_PHOTOS) if name == "natural" else 10
    else:
        c, h, w, classes = SHAPES[name]
        if "size" in spec and (name in IMAGE_FOLDERS or not spec.get("stand_in")):
            h = w = spec["size"]
    if spec.get("task") and not spec.get("stand_in"):  # a stand-in's task is the parity
        classes = 2 if spec["task"] == "parity" else 10
    return (c, h, w), classes


def label_count(name: str, spec: dict) -> int | None:
    """How many different labels a configured image dataset's images can have (None: not
    known before it is prepared: an image folder's class folders, an attribute task's).
    A ``digits`` stand-in keeps the digits' 10; a ``natural`` one labels each crop by its
    photograph modulo the classes."""
    if name in ATTRIBUTE_DATASETS or name not in DATASETS:
        return None
    classes, kind = shape(name, spec)[1], spec.get("stand_in")
    if kind == "digits":
        return 10
    if kind == "natural":
        return min(len(NATURAL_PHOTOS), classes)
    return classes if kind == "fake" or name not in IMAGE_FOLDERS else None


def split_capacity(name: str, spec: dict, split: str = "train") -> int | None:
    """An upper bound of the images in ``split`` of a configured dataset (None: unknown)."""
    total = size(name, spec)
    fractions = spec.get("splits") or {}
    if total is None or not fractions:
        return total
    others = sum(v for k, v in fractions.items() if k != split)
    share = max(fractions.get(split, 0), 1 - others if split == next(iter(fractions)) else 0)
    classes = SHAPES[name][3] if name in SHAPES else 10
    # stratified rounding moves at most one image per class and split
    return int(total * share) + classes * len(fractions)


def load_stand_in(name: str, kind: str, seed: int = 0, size: int | None = None,
                  count: int = STAND_IN_SIZE) -> ImageData:
    """Bundled data in the image shape and class count of ``name``; an image folder's
    images ``size`` pixels square, as its loader resizes them. ``digits``: scikit-learn's
    digits resized; ``fake``: torchvision's FakeData (noise); ``natural``: ``count`` crops
    of scikit-image's photographs (``load_natural``), each labelled by its photograph
    (modulo the class count)."""
    if name not in SHAPES:
        raise ValueError(f"no stand-in shape for dataset {name!r}; expected one of "
                         f"{sorted(SHAPES)}")
    if name in ATTRIBUTE_DATASETS:
        return attributes.stand_in(name, kind, seed)
    channels, height, width, classes = SHAPES[name]
    if size is not None and name in IMAGE_FOLDERS:
        height = width = size
    if kind == "digits":
        digits = load_digits(channels, height)
        x = F.interpolate(digits.x, size=(height, width), mode="bilinear", align_corners=False)
        return ImageData(x.clamp(0, 1).contiguous(), digits.y, classes)
    if kind == "natural":  # each dataset its own crops (ImageNet's are not CIFAR-10's)
        photos = load_natural(count, seed + zlib.crc32(name.encode()), channels, height)
        return ImageData(photos.x, photos.y % classes, classes)
    if kind == "fake":
        from torchvision.datasets import FakeData
        from torchvision.transforms.functional import pil_to_tensor

        fake = FakeData(STAND_IN_SIZE, (channels, height, width), classes, random_offset=seed)
        images, labels = zip(*((pil_to_tensor(image), label) for image, label in fake))
        x = torch.stack(images).float() / 255.0
        return ImageData(x, torch.as_tensor(labels, dtype=torch.int64), classes)
    raise ValueError(f"stand_in must be 'digits', 'fake' or 'natural', got {kind!r}")


def missing(name: str, options: dict) -> str | None:
    """Why dataset ``name`` cannot be loaded with ``options`` before any job runs (a local
    root without its files and no download asked for), or None when it can."""
    if options.get("stand_in"):
        return None
    if name in ATTRIBUTE_DATASETS:
        return attributes.missing(name, options)
    if options.get("download") or name not in {"mnist", *TORCHVISION, *IMAGE_FOLDERS}:
        return None
    root = Path(options["root"])
    if name in IMAGE_FOLDERS:
        where = root / options["split"]
        if where.is_dir():
            return None
        return (f"dataset {name!r} not found at {where}: put it there in torchvision's "
                f"ImageFolder layout ({where}/<class>/<image>) or set datasets.{name}.root")
    if name == "mnist":
        raw = root / "MNIST" / "raw"
        prefix = "t10k" if options.get("split", "test") == "test" else "train"
        found = any((raw / f"{prefix}-images-idx3-ubyte{gz}").is_file() for gz in ("", ".gz"))
        where, how = raw, "torchvision.datasets.MNIST(root, download=True)"
    else:
        where = root / TORCHVISION[name][1]
        found = where.exists()
        how = f"torchvision.datasets.{TORCHVISION[name][0]}(root, download=True)"
    if found:
        return None
    return (f"dataset {name!r} not found at {where}: set datasets.{name}.root to the folder "
            f"that holds it, get it with {how} where a network is available, or set "
            f"datasets.{name}.download: true")


def load(name: str, **options) -> ImageData:
    """Load a dataset by name; options are those of the loader (``stand_in``: smoke data)."""
    stand_in = options.pop("stand_in", None)
    if stand_in:  # its first max_images, as a folder's (a smoke run's cheaper evaluation)
        data = load_stand_in(name, stand_in, size=options.get("size"),
                             count=options.get("max_images", STAND_IN_SIZE))
        return data.subset(torch.arange(min(len(data), options.get("max_images", len(data)))))
    if name in TORCHVISION:
        return load_torchvision(name, **options)
    if name in IMAGE_FOLDERS:
        return load_image_folder(name, **options)
    if name in ATTRIBUTE_DATASETS:
        return attributes.LOADERS[name](**options)
    if name == "digits":  # with the attributes that the digit does not imply
        digits = load_digits(**options)
        found = digit_attributes(digits.x, digits.y)
        return ImageData(digits.x, digits.y, digits.num_classes,
                         {a: found[a] for a in attributes.CLASSES["digits"]})
    loaders = {"natural": load_natural, "mnist": load_mnist}
    if name not in loaders:
        raise ValueError(f"unknown dataset {name!r}; expected one of {sorted(DATASETS)}")
    return loaders[name](**options)
