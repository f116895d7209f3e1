"""Datasets, splits, client partitions and prepared-data manifests.

The names below load their module on first use (PEP 562), so that a torch-free module
of the package (``data.attribute_counts``, read by the plan) does not import every
loader with it.
"""

from __future__ import annotations

from gradleak.utils.lazy import names_of

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
__all__ = sorted(name for names in _HOMES.values() for name in names)
__getattr__ = names_of(__name__, _HOMES)
