"""Image metrics (after optimal matching), utility metrics and the attack success rate."""

from fedleak.metrics.image import (
    lpips,
    lpips_unavailable_reason,
    match,
    mse,
    noise_ratio,
    psnr,
    ssim,
    stlpips,
)
from fedleak.metrics.utility import accuracy, evaluate, pmm

__all__ = ["accuracy", "evaluate", "lpips", "lpips_unavailable_reason", "match", "mse",
           "noise_ratio", "pmm", "psnr", "ssim", "stlpips"]
