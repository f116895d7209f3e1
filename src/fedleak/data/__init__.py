"""Datasets, splits, client partitions and prepared-data manifests."""

from fedleak.data.datasets import DATASETS, ImageData, load, load_digits, load_mnist, load_natural
from fedleak.data.prepared import load_prepared, prepare
from fedleak.data.splits import dirichlet_partition, iid_partition, partition, stratified_splits

__all__ = [
    "DATASETS", "ImageData", "load", "load_digits", "load_mnist", "load_natural",
    "load_prepared", "prepare", "dirichlet_partition", "iid_partition", "partition",
    "stratified_splits",
]
