"""Where a phase runs: the configuration's ``device`` (``auto``: CUDA when present), with
torch's deterministic settings (``seeding.deterministic_kernels``, after torch's
"Reproducibility" notes), and moving what a phase holds onto it or back to the CPU.

Every phase calls :func:`select` first, before it builds a model or touches CUDA, then
puts its data and models on that device once; files are written device-free
(``utils.io.save_torch`` keeps CPU tensors), so a checkpoint trained on CUDA loads on a
machine without one."""

from __future__ import annotations

from typing import Any

import torch

from gradleak.utils.seeding import deterministic_kernels


def resolve(name: str) -> torch.device:
    """``auto`` -> ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``; ``cuda``
    where there is none is a ValueError."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False; "
                         "expected 'device: cpu' or 'auto' on a machine without a GPU")
    return torch.device(name)


def select(name: str) -> torch.device:
    """The device a phase runs on (:func:`resolve`), with deterministic kernels switched on
    first (``CUBLAS_WORKSPACE_CONFIG`` is set before cuBLAS first runs)."""
    deterministic_kernels()
    return resolve(name)


def to_device(value: Any, device: torch.device | str) -> Any:
    """``value`` on ``device``: tensors, modules (moved in place) and anything else with
    a ``to(device)`` (``data.ImageData``, ``adversaries.ModelZoo``), inside dicts, lists and
    tuples; other values unchanged. A container whose contents are already there is itself
    (a CPU state dict saved from the CPU is the very object, ``_metadata`` and all); a
    moved state dict keeps its type and ``_metadata`` (``load_state_dict`` reads it)."""
    if isinstance(value, dict):
        moved = {k: to_device(v, device) for k, v in value.items()}
        if all(moved[k] is v for k, v in value.items()):
            return value
        out = type(value)(moved)
        if hasattr(value, "_metadata"):
            out._metadata = value._metadata
        return out
    if isinstance(value, (list, tuple)):
        items = [to_device(v, device) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(items) if type(value) in (list, tuple) else type(value)(*items)
    if isinstance(value, (str, bytes)) or not callable(getattr(value, "to", None)):
        return value
    return value.to(device)
