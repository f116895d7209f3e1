"""Generator priors for GAN-based attacks (GGA/GGL, GIAS, GIML, GIFD).

The DCGAN generator emits 32x32 images in [-1, 1]; attacks see them as
(x + 1) / 2 in [0, 1], resized and converted to the model's input shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
