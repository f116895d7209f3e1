"""Deterministic seeding (DESIGN §6, §9)."""

from __future__ import annotations

import os
import random
import sys

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
    deterministic_kernels()
    if threads is not None:
        torch.set_num_threads(threads)


def deterministic_kernels() -> None:
    """``torch.use_deterministic_algorithms(True)`` without its import of
    ``torch._inductor`` (1.4 s of every job's start-up with torch 2.14, for a compiler fedleak
    does not use): the flag is set in torch's core, and through the public call only where
    the compiler is already loaded, whose own flag it also sets."""
    if "torch._inductor.config" in sys.modules or \
            not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(True)
    else:
        torch._C._set_deterministic_algorithms(True)


def child_seeds(seed: int, concerns: list[str]) -> dict[str, int]:
    """One independent integer seed per named concern, from one SeedSequence."""
    children = np.random.SeedSequence(seed).spawn(len(concerns))
    return {name: int(c.generate_state(1)[0]) for name, c in zip(concerns, children)}


def derived_seed(*keys: int) -> int:
    """An integer seed determined by ``keys`` (e.g. a victim's seed and a restart index)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0])
