"""RecUP-FL's FL models (Appendix B, Table 2): a small CNN per image dataset, an MLP for Adult.

``AttributeCNN`` (``layout``):

- ``lfw`` (Table 2c, the default): three 3x3 convolutions (32, 64, 128 channels, stride 1),
  each followed by ReLU and 2x2 max pooling, then Linear 256 + ReLU and the output layer;
- ``audiomnist`` (2a): 3x3 convolutions of 16, 32, 64 channels with stride 2, each
  followed by BatchNorm, ReLU and 2x2 max pooling, then Linear 32 + ReLU and the output;
- ``celeba`` (2d): four stride-2 convolutions (16, 32, 64, 128) with ReLU and pooling,
  Dropout 0.2, then Linear 256 and Linear 128 (no activation between them, as the table
  lists none) and the output.

Convolutions pad by 1 and pooling rounds up (``ceil_mode``), so any input of at least
1x1, square or not (LFW's 62x47), keeps a spatial extent of at least 1 (the table's
CelebA layout reaches 1x1 at 32x32). ReLU and max pooling commute, so the table's order
(pool, then ReLU) is the same function. The table's final sigmoid is left out: the
output is logits for the cross-entropy loss.

``TabularFC`` (Table 2b): Linear(F, 50) + ReLU + Linear(50, classes) on rows stored as
(N, 1, 1, F). The paper trains it with one sigmoid output on the MSE loss; gradleak's FL
trains every model with cross-entropy, so it has ``num_classes`` (2) logits instead.

Both have ``input_shape`` (C, H, W) and ``features(x)`` (the final Linear layer's input,
which Soteria uses); the final Linear is the last Linear module.
"""

from __future__ import annotations

import torch
from torch import nn

LAYOUTS = {
    "lfw": {"widths": (32, 64, 128), "stride": 1, "batchnorm": False, "dropout": 0.0,
            "hidden": (256,), "hidden_activation": True},
    "audiomnist": {"widths": (16, 32, 64), "stride": 2, "batchnorm": True, "dropout": 0.0,
                   "hidden": (32,), "hidden_activation": True},
    "celeba": {"widths": (16, 32, 64, 128), "stride": 2, "batchnorm": False, "dropout": 0.2,
               "hidden": (256, 128), "hidden_activation": False},
}


def _check_shape(input_shape) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape must be (C, H, W) with positive sides, got {input_shape}")
    return shape


class AttributeCNN(nn.Module):
    def __init__(self, input_shape: tuple[int, int, int], num_classes: int = 2,
                 layout: str = "lfw") -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"attribute_cnn layout must be one of {sorted(LAYOUTS)}, "
                             f"got {layout!r}")
        spec = LAYOUTS[layout]
        self.input_shape = _check_shape(input_shape)
        self.layout = layout
        channels, height, width = self.input_shape
        layers: list[nn.Module] = []
        for out in spec["widths"]:
            layers.append(nn.Conv2d(channels, out, 3, stride=spec["stride"], padding=1))
            if spec["batchnorm"]:
                layers.append(nn.BatchNorm2d(out))
            layers += [nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)]
            channels = out
            height = (height - 1) // spec["stride"] + 1
            width = (width - 1) // spec["stride"] + 1
            height, width = (height + 1) // 2, (width + 1) // 2
        layers.append(nn.Flatten())
        if spec["dropout"]:
            layers.append(nn.Dropout(spec["dropout"]))
        size = channels * height * width
        for hidden in spec["hidden"]:
            layers.append(nn.Linear(size, hidden))
            if spec["hidden_activation"]:
                layers.append(nn.ReLU())
            size = hidden
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(size, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The input of the final Linear layer."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


class TabularFC(nn.Module):
    def __init__(self, input_shape: tuple[int, int, int], num_classes: int = 2,
                 hidden: int = 50) -> None:
        super().__init__()
        self.input_shape = _check_shape(input_shape)
        if hidden < 1:
            raise ValueError(f"tabular_fc hidden must be >= 1, got {hidden}")
        features = self.input_shape[0] * self.input_shape[1] * self.input_shape[2]
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(features, hidden), nn.ReLU())
        self.fc = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The input of the final Linear layer."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))
