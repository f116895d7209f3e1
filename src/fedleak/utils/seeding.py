"""Deterministic seeding (DESIGN §6, §9)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed python, numpy and torch and switch torch to deterministic kernels."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    if threads is not None:
        torch.set_num_threads(threads)


def child_seeds(seed: int, concerns: list[str]) -> dict[str, int]:
    """One independent integer seed per named concern, from one SeedSequence."""
    children = np.random.SeedSequence(seed).spawn(len(concerns))
    return {name: int(c.generate_state(1)[0]) for name, c in zip(concerns, children)}


def derived_seed(*keys: int) -> int:
    """An integer seed determined by ``keys`` (e.g. a victim's seed and a restart index)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0])
