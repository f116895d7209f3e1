"""ResNet-10/18/34 (He et al., 2016) with the CIFAR stem (3x3 conv, no max-pool) for 32x32 input."""

from __future__ import annotations

import torch
from torch import nn

BLOCKS = {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, depth: int = 18, channels: int = 3, num_classes: int = 10,
                 image_size: int = 32, width: int = 64) -> None:
        super().__init__()
        if depth not in BLOCKS:
            raise ValueError(f"resnet depth must be one of {sorted(BLOCKS)}, got {depth}")
        self.input_shape = (channels, image_size, image_size)
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        layers, in_planes = [], width
        for stage, count in enumerate(BLOCKS[depth]):
            planes = width * 2**stage
            for block in range(count):
                layers.append(BasicBlock(in_planes, planes, 2 if stage and not block else 1))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.layers(self.stem(x))).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))
