"""Datasets, splits, client partitions and prepared-data manifests.

The names below load their module on first use (PEP 562), so that a torch-free module
of the package (``data.attribute_counts``, read by the plan) does not import every
loader with it.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "datasets": ("DATASETS", "load", "load_natural"),
    "adult": ("load_adult",),
    "audiomnist": ("load_audiomnist",),
    "celeba": ("load_celeba",),
    "digit_attributes": ("load_digits_attributes", "load_mnist_attributes"),
    "digits": ("load_digits", "load_mnist"),
    "image_data": ("ImageData",),
    "lfw": ("load_lfw",),
    "prepared": ("attribute_classes", "load_prepared", "prepare", "read_manifest"),
    "splits": ("attribute_partition", "client_dirichlet_partition", "dirichlet_partition",
               "iid_partition", "partition", "stratified_splits"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    """A name of ``_HOMES`` from its module, or a submodule (``data.datasets``) by name."""
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
