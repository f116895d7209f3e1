"""Models: LeNet (DLG), ResNet-10/18/34 (CIFAR stem), R-GAP's CNN6/CNN10, RecUP-FL's
attribute CNN and tabular MLP, the Refiner evaluation network, DCGAN."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from gradleak.models.attribute import AttributeCNN, TabularFC
from gradleak.models.cnn import CNN
from gradleak.models.dcgan import Discriminator, Generator
from gradleak.models.evalnet import EvaluationNetwork
from gradleak.models.lenet import LeNet
from gradleak.models.resnet import ResNet

CLASSIFIERS = ("lenet", "resnet10", "resnet18", "resnet34", "cnn6", "cnn10", "attribute_cnn",
               "tabular_fc")


def build(name: str, channels: int, num_classes: int, image_size: int,
          input_shape: tuple[int, int, int] | None = None, **options) -> nn.Module:
    """A classifier by name; ``options`` go to its constructor (e.g. ``uniform_init``,
    ``layout``). ``input_shape`` (C, H, W), when given, is the input's shape: needed for
    non-square images (``attribute_cnn``) and tabular rows (``tabular_fc``: (1, 1, F));
    without it the input is (channels, image_size, image_size)."""
    if name not in CLASSIFIERS:
        raise ValueError(f"unknown model {name!r}; expected one of {list(CLASSIFIERS)}")
    shape = (channels, image_size, image_size) if input_shape is None else tuple(input_shape)
    if len(shape) != 3 or shape[0] != channels:
        raise ValueError(f"{name}: input_shape must be (C, H, W) with C = channels "
                         f"({channels}), got {input_shape}")
    if name == "attribute_cnn":
        return AttributeCNN(shape, num_classes, **options)
    if name == "tabular_fc":
        if input_shape is None:
            raise ValueError("tabular_fc needs input_shape=(1, 1, F), the shape of a data row")
        return TabularFC(shape, num_classes, **options)
    if shape[1:] != (image_size, image_size):
        raise ValueError(f"{name} needs a square {image_size}x{image_size} input, got "
                         f"input_shape {tuple(shape)}")
    if name == "lenet":
        return LeNet(channels, num_classes, image_size, **options)
    if name in ("cnn6", "cnn10"):
        return CNN(int(name[3:]), channels, num_classes, image_size, **options)
    return ResNet(int(name[6:]), channels, num_classes, image_size, **options)


def for_case(case: Mapping, shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """A configured case's classifier (``cases[]``: ``model``, LeNet's ``uniform_init``,
    the attribute CNN's ``layout``) for inputs of ``shape`` (C, H, W)."""
    options = {"lenet": {"uniform_init": case["uniform_init"]},
               "attribute_cnn": {"layout": case["layout"]}}.get(case["model"], {})
    return build(case["model"], shape[0], num_classes, shape[1], input_shape=shape, **options)


__all__ = ["CLASSIFIERS", "CNN", "AttributeCNN", "Discriminator", "EvaluationNetwork",
           "Generator", "LeNet", "ResNet", "TabularFC", "build", "for_case"]
