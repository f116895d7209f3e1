"""Image metrics (after optimal matching), layer-wise errors of recovered layer inputs,
utility metrics and the attack success rate."""

from gradleak.metrics.image import (
    lpips,
    lpips_unavailable_reason,
    match,
    mse,
    noise_ratio,
    psnr,
    ssim,
    stlpips,
)
from gradleak.metrics.layers import layer_errors, layer_inputs
from gradleak.metrics.utility import accuracy, evaluate, pmm

__all__ = ["accuracy", "evaluate", "layer_errors", "layer_inputs", "lpips",
           "lpips_unavailable_reason", "match", "mse", "noise_ratio", "pmm", "psnr", "ssim",
           "stlpips"]
