import numpy as np
import pytest
import torch

from gradleak import data
from gradleak.utils.io import read_json


def test_digits_are_32x32_in_unit_range(digits):
    assert digits.x.shape == (1797, 1, 32, 32)
    assert 0 <= float(digits.x.min()) and float(digits.x.max()) <= 1
    assert data.load_digits(channels=3).x.shape[1] == 3


@pytest.mark.slow
def test_natural_crops_are_seeded():
    a, b = data.load_natural(50, seed=3), data.load_natural(50, seed=3)
    c = data.load_natural(50, seed=4)
    assert a.x.shape == (50, 3, 32, 32)
    assert torch.equal(a.x, b.x) and not torch.equal(a.x, c.x)


def test_mnist_test_split_reads_from_local_root(mnist_root):
    mnist = data.load_mnist(mnist_root, split="test")
    assert mnist.x.shape == (10000, 1, 28, 28)
    assert mnist.y[:5].tolist() == [7, 2, 1, 0, 4]


def test_missing_mnist_names_the_expected_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "MNIST" / "raw")):
        data.load_mnist(tmp_path)


def test_iid_partition_covers_every_sample_once():
    parts = data.iid_partition(103, 10, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(103))


def test_dirichlet_partition_is_label_skewed(digits):
    labels = digits.y.numpy()
    skewed = data.dirichlet_partition(labels, 10, 0.1, np.random.default_rng(0))
    even = data.dirichlet_partition(labels, 10, 100.0, np.random.default_rng(0))
    assert sorted(np.concatenate(skewed).tolist()) == list(range(len(labels)))

    def dominant_share(parts):
        return np.mean([np.bincount(labels[p]).max() / len(p) for p in parts])

    assert dominant_share(skewed) > 2 * dominant_share(even)


def test_prepare_writes_manifest_with_hashes(tmp_path):
    manifest = data.prepare("digits", tmp_path, {"channels": 1},
                            {"train": 0.6, "public": 0.2, "test": 0.2}, seed=0)
    assert sum(s["count"] for s in manifest["splits"].values()) == 1797
    assert read_json(tmp_path / "manifest.json") == manifest
    test = data.load_prepared(tmp_path, "test")
    assert len(test) == manifest["splits"]["test"]["count"]
    (tmp_path / "test_y.npy").write_bytes(b"corrupt")
    with pytest.raises(ValueError, match="sha256"):
        data.load_prepared(tmp_path, "test")
