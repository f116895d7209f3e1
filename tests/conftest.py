"""Shared fixtures: real data (digits, the MNIST test set) and a fixed thread count."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def digits():
    from fedleak.data import load_digits

    return load_digits(channels=1)


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """The real MNIST test set beside the repository; CI must have it, elsewhere it is optional."""
    raw = SHARED_DATASETS / "MNIST" / "raw"
    if not raw.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the MNIST test set at {raw}")
        pytest.skip(f"the MNIST test set is not at {raw}")
    return SHARED_DATASETS
