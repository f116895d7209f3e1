"""LeNet as used by DLG (Zhu et al., NeurIPS 2019), iDLG and EPAFL.

Three 5x5 convolutions with 12 channels (strides 2, 2, 1, padding 2), a Sigmoid
after each, then one Linear layer. ``uniform_init`` draws every weight and bias
from U(-0.5, 0.5) as the official DLG code does.
"""

from __future__ import annotations

import torch
from torch import nn


class LeNet(nn.Module):
    def __init__(self, channels: int = 3, num_classes: int = 10, image_size: int = 32,
                 uniform_init: bool = True) -> None:
        super().__init__()
        self.input_shape = (channels, image_size, image_size)
        self.body = nn.Sequential(
            nn.Conv2d(channels, 12, kernel_size=5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1), nn.Sigmoid(),
        )
        side = (image_size + 1) // 2
        side = (side + 1) // 2
        self.fc = nn.Linear(12 * side * side, num_classes)
        if uniform_init:
            for param in self.parameters():
                nn.init.uniform_(param, -0.5, 0.5)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The flattened input of the final Linear layer."""
        return self.body(x).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))
