"""The untrained image generator of Fan et al.'s FedLeak (USENIX Security 2025; the authors'
artifact, ``generator.py``), whose weights an attack optimises: a deep image prior.

A code z (``code_dim``, 128) maps through a transposed 4x4 convolution, BatchNorm and
LeakyReLU(0.1) to a 4x4 feature map of ``channels`` (256); a block of two spectrally
normalised 3x3 convolutions, each followed by BatchNorm and LeakyReLU(0.1), runs at 4x4 and
after each nearest-neighbour x2 upsampling up to the first side S = 4 x 2^k at least the
image's; a 1x1 convolution and a sigmoid give the image's channels in [0, 1]. Channels
halve in the blocks at 64 and 128 (a quarter from 128 on), as the artifact's.

Departures, each to stack P generators with ``torch.func`` (no state kept between
evaluations): BatchNorm always normalises by the batch's own statistics (the artifact's
generator is never put in eval mode, so it always does too; here without the running
statistics it never reads); spectral normalisation divides by the exact largest singular
value (the limit of the artifact's one power iteration per evaluation, the same gradient
at it); images whose side is not 4 x 2^k are the S x S output resized bilinearly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SLOPE = 0.1  # LeakyReLU's negative slope


class SpectralConv(nn.Conv2d):
    """A 3x3 convolution whose weight is divided by its largest singular value (Miyato et
    al. 2018), computed exactly at every evaluation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.flatten(1)
        gram = weight @ weight.T if len(weight) <= weight.shape[1] else weight.T @ weight
        sigma = torch.linalg.eigvalsh(gram)[-1].sqrt()  # cheaper than an SVD, the same value
        return self._conv_forward(x, self.weight / sigma, self.bias)


def _block(inputs: int, outputs: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in (inputs, outputs):
        layers += [SpectralConv(width, outputs, 3, padding=1),
                   nn.BatchNorm2d(outputs, track_running_stats=False), nn.LeakyReLU(SLOPE)]
    return nn.Sequential(*layers)


def _width(side: int, channels: int) -> int:
    """The channels of the block at ``side``: ``channels`` up to 32, half at 64, a quarter
    from 128 on."""
    return channels if side <= 32 else channels // 2 if side == 64 else channels // 4


class DeepImagePrior(nn.Module):
    """Codes (N, code_dim) -> images (N, *image_shape) in [0, 1]."""

    def __init__(self, image_shape: tuple[int, int, int], channels: int = 256,
                 code_dim: int = 128) -> None:
        super().__init__()
        self.image_shape, self.code_dim = tuple(image_shape), code_dim
        side = 4
        self.input = nn.Sequential(nn.ConvTranspose2d(code_dim, channels, 4, 1, 0),
                                   nn.BatchNorm2d(channels, track_running_stats=False),
                                   nn.LeakyReLU(SLOPE))
        blocks, width = [_block(channels, channels)], channels
        while side < max(self.image_shape[1:]):
            side *= 2
            blocks.append(_block(width, _width(side, channels)))
            width = _width(side, channels)
        self.blocks = nn.ModuleList(blocks)
        self.to_image = nn.Conv2d(width, self.image_shape[0], 1)
        self.side = side

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        out = self.blocks[0](self.input(codes.view(-1, self.code_dim, 1, 1)))
        for block in self.blocks[1:]:
            out = block(F.interpolate(out, scale_factor=2))
        images = torch.sigmoid(self.to_image(out))
        if images.shape[-2:] != self.image_shape[1:]:
            images = F.interpolate(images, size=self.image_shape[1:], mode="bilinear",
                                   antialias=True, align_corners=False)
        return images

