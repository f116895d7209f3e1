"""Image metrics (after optimal matching), layer-wise errors of recovered layer inputs,
utility metrics and the attack success rate.

The names below load their module on first use (PEP 562): the tables read
``metrics.maintenance.pmm`` without importing torch.
"""

from __future__ import annotations

from gradleak.utils.lazy import names_of

_HOMES = {
    "image": ("flat_psnr", "lpips", "lpips_unavailable_reason", "match", "mse", "noise_ratio",
              "psnr", "ssim", "stlpips"),
    "layers": ("layer_errors", "layer_inputs"),
    "utility": ("accuracy", "evaluate"),
    "maintenance": ("pmm",),
}
__all__ = sorted(name for names in _HOMES.values() for name in names)
__getattr__ = names_of(__name__, _HOMES)
