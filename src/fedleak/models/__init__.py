"""Models: LeNet (DLG), ResNet-10/18/34 (CIFAR stem), the Refiner evaluation network, DCGAN."""

from __future__ import annotations

from torch import nn

from fedleak.models.dcgan import Discriminator, Generator
from fedleak.models.evalnet import EvaluationNetwork
from fedleak.models.lenet import LeNet
from fedleak.models.resnet import ResNet

CLASSIFIERS = ("lenet", "resnet10", "resnet18", "resnet34")


def build(name: str, channels: int, num_classes: int, image_size: int, **options) -> nn.Module:
    """A classifier by name; ``options`` go to its constructor (e.g. ``uniform_init``)."""
    if name == "lenet":
        return LeNet(channels, num_classes, image_size, **options)
    if name in ("resnet10", "resnet18", "resnet34"):
        return ResNet(int(name[6:]), channels, num_classes, image_size, **options)
    raise ValueError(f"unknown model {name!r}; expected one of {list(CLASSIFIERS)}")


__all__ = ["CLASSIFIERS", "Discriminator", "EvaluationNetwork", "Generator", "LeNet",
           "ResNet", "build"]
