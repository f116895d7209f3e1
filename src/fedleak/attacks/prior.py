"""Generator priors for GAN-based attacks (GGA/GGL, GIAS, GIML, GIFD).

The DCGAN generator emits 32x32 images in [-1, 1]; attacks see them as
(x + 1) / 2 in [0, 1], resized and converted to the model's input shape.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def to_model_input(generated: torch.Tensor, input_shape: tuple[int, int, int]) -> torch.Tensor:
    """Map generator output in [-1, 1] to [0, 1] images of ``input_shape`` (C, H, W)."""
    channels, height, width = input_shape
    images = (generated + 1) / 2
    if images.shape[1] != channels:
        if images.shape[1] == 1:
            images = images.expand(-1, channels, -1, -1)
        elif channels == 1:
            images = images.mean(dim=1, keepdim=True)
        else:
            raise ValueError(f"cannot map {images.shape[1]}-channel generator output to "
                             f"{channels} channels")
    if images.shape[-2:] != (height, width):
        images = F.interpolate(images, size=(height, width), mode="bilinear",
                               align_corners=False)
    return images


def rendered(decode: nn.Module, input_shape: tuple[int, int, int]
             ) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """A generator stage's render: its first variable (P, B, ...) decoded as one batch and
    mapped to model-input images (P, B, C, H, W)."""
    def render(variables: list[torch.Tensor]) -> torch.Tensor:
        v = variables[0]
        return to_model_input(decode(v.flatten(0, 1)), input_shape).unflatten(0, v.shape[:2])

    return render


def frozen_copy(generator: nn.Module, device: torch.device | None = None) -> nn.Module:
    """An eval-mode copy of ``generator`` (on ``device``) without parameter gradients; the
    caller's generator is untouched."""
    if not isinstance(generator, nn.Module):
        raise ValueError(f"generator must be a torch.nn.Module, got {type(generator).__name__}")
    out = copy.deepcopy(generator).eval().requires_grad_(False)
    return out if device is None else out.to(device)


def latent_dim(generator: nn.Module) -> int:
    """The generator's integer ``latent_dim`` attribute (ValueError naming its type if absent)."""
    if not isinstance(getattr(generator, "latent_dim", None), int):
        raise ValueError(f"the generator needs an integer latent_dim attribute; "
                         f"{type(generator).__name__} has none")
    return generator.latent_dim
