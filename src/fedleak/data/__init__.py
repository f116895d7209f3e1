"""Datasets, splits, client partitions and prepared-data manifests."""

from fedleak.data.attributes import (
    load_adult,
    load_audiomnist,
    load_celeba,
    load_digits_attributes,
    load_lfw,
    load_mnist_attributes,
)
from fedleak.data.datasets import DATASETS, ImageData, load, load_digits, load_mnist, load_natural
from fedleak.data.prepared import attribute_classes, load_prepared, prepare, read_manifest
from fedleak.data.splits import (
    attribute_partition,
    client_dirichlet_partition,
    dirichlet_partition,
    iid_partition,
    partition,
    stratified_splits,
)

__all__ = [
    "DATASETS", "ImageData", "load", "load_digits", "load_mnist", "load_natural",
    "load_adult", "load_audiomnist", "load_celeba", "load_digits_attributes", "load_lfw",
    "load_mnist_attributes", "attribute_classes", "load_prepared", "prepare", "read_manifest",
    "attribute_partition", "client_dirichlet_partition", "dirichlet_partition", "iid_partition",
    "partition", "stratified_splits",
]
