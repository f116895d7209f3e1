"""Deterministic seeding."""

from __future__ import annotations

import ast
import os
import random
import sys

import numpy as np
import torch

from gradleak.utils.threads import use_threads


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed python, numpy and torch and switch torch to deterministic kernels; ``threads``:
    the job's CPU threads, torch's and the BLAS and OpenMP pools' (``use_threads``)."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    deterministic_kernels()  # first: before torch.manual_seed can reach CUDA
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if threads is not None:
        use_threads(threads)


def deterministic_kernels() -> None:
    """Deterministic kernels as torch's "Reproducibility" notes ask, on the CPU and CUDA:
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (unless set; read when cuBLAS first runs, so before
    any CUDA work), cuDNN's deterministic algorithms without benchmarking, and
    ``torch.use_deterministic_algorithms(True)`` without its import of ``torch._inductor``
    (1.4 s of every job's start-up with torch 2.14, for a compiler gradleak does not use):
    the flag is set in torch's core, and through the public call only where the compiler is
    already loaded, whose own flag it also sets. Also full float32 precision in cuDNN's
    convolutions (torch lets them round inputs to TensorFloat-32 on Ampere and later GPUs;
    its matrix products already keep float32): gradient matching is sensitive to it. The
    one place gradleak sets these (``seed_everything`` and ``utils.device.select`` call it)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
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


def global_state() -> dict:
    """The states of python's, numpy's and torch's global generators (CUDA's too), in what
    ``save_torch`` stores and ``weights_only`` loads: what a resumed job restores."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": repr(random.getstate()),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []}


def restore_global_state(state: dict) -> None:
    """Put the global generators back into ``state`` (:func:`global_state`)."""
    random.setstate(ast.literal_eval(state["python"]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
