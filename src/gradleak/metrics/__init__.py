"""Image metrics (after optimal matching), layer-wise errors of recovered layer inputs,
utility metrics and the attack success rate.

The names below load their module on first use (PEP 562): the tables read
``metrics.maintenance.pmm`` without importing torch.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "image": ("lpips", "lpips_unavailable_reason", "match", "mse", "noise_ratio", "psnr",
              "ssim", "stlpips"),
    "layers": ("layer_errors", "layer_inputs"),
    "utility": ("accuracy", "evaluate"),
    "maintenance": ("pmm",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    """A name of ``_HOMES`` from its module, or a submodule (``data.datasets``) by name."""
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
