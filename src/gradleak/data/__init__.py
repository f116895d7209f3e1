"""Datasets, splits, client partitions and prepared-data manifests."""

from gradleak.data.adult import load_adult
from gradleak.data.audiomnist import load_audiomnist
from gradleak.data.celeba import load_celeba
from gradleak.data.datasets import DATASETS, load, load_natural
from gradleak.data.digit_attributes import load_digits_attributes, load_mnist_attributes
from gradleak.data.digits import load_digits, load_mnist
from gradleak.data.image_data import ImageData
from gradleak.data.lfw import load_lfw
from gradleak.data.prepared import attribute_classes, load_prepared, prepare, read_manifest
from gradleak.data.splits import (
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
