"""CNN6 and CNN10, the bias-free LeakyReLU networks of R-GAP (Zhu and Blaschko, ICLR 2021,
Fig. 3; official code ``models/CNN6.py``), used by GIAS App. C (Figs. A1, A2).

CNN6, as the official code defines it: six convolutions without bias, each followed by
LeakyReLU(0.2), no pooling or normalisation: 3->12 (4x4, stride 2, padding 2), 12->36
(3x3, stride 2), 36->36 (3x3) twice, 36->64 (3x3, stride 2), 64->128 (3x3); padding 1
and stride 1 where not said; then one Linear layer without bias (3200 inputs at 32x32).
The official head has one output (a logistic loss); here it has ``num_classes`` outputs
for gradleak's cross-entropy. Weights keep PyTorch's default initialisation, as there.

CNN10 is not in the official code (GIAS names it only: "ten convolution layers and one
FC layer"); it is derived by CNN6's rule with the width-preserving 36-channel 3x3 block
repeated six times instead of twice (same widths, strides and head).
"""

from __future__ import annotations

import torch
from torch import nn

# (in, out, kernel, stride, padding) after the first layer's (channels, 12, 4, 2, 2)
_MIDDLE = {6: 2, 10: 6}  # depth -> repeats of the 36->36 block


class CNN(nn.Module):
    def __init__(self, depth: int = 6, channels: int = 3, num_classes: int = 10,
                 image_size: int = 32, slope: float = 0.2) -> None:
        super().__init__()
        if depth not in _MIDDLE:
            raise ValueError(f"CNN depth must be one of {sorted(_MIDDLE)}, got {depth}")
        self.input_shape = (channels, image_size, image_size)
        specs = [(channels, 12, 4, 2, 2), (12, 36, 3, 2, 1),
                 *[(36, 36, 3, 1, 1)] * _MIDDLE[depth], (36, 64, 3, 2, 1), (64, 128, 3, 1, 1)]
        layers: list[nn.Module] = []
        for cin, cout, kernel, stride, padding in specs:
            layers += [nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False),
                       nn.LeakyReLU(slope)]
        self.body = nn.Sequential(*layers)
        with torch.no_grad():
            features = self.body(torch.zeros(1, *self.input_shape)).numel()
        self.fc = nn.Linear(features, num_classes, bias=False)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The flattened input of the final Linear layer."""
        return self.body(x).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))
