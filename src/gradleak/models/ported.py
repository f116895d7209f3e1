"""The configuration's ``gan:`` read into a pretrained generator's class and constructor
arguments: StyleGAN2 or BigGAN-deep, loadable from their public PyTorch ports' weights
(``port_state``)."""

from __future__ import annotations

from torch import nn

from gradleak.models.biggan import BigGANGenerator
from gradleak.models.stylegan2 import StyleGAN2Generator


def architecture(gan: dict) -> tuple[type[nn.Module], dict]:
    """The pretrained kind's generator class and its constructor arguments, from the
    configuration's ``gan:`` (``gan.kind`` stylegan2 or biggan, ``gan.resolution`` and the
    kind's section; widths listed per resolution 4, 8, ...)."""
    kind, spec = gan["kind"], gan[gan["kind"]]
    widths = spec["widths"]
    if kind == "stylegan2":
        return StyleGAN2Generator, {
            "resolution": gan["resolution"], "latent_dim": spec["latent_dim"],
            "n_mlp": spec["n_mlp"], "channel_multiplier": spec["channel_multiplier"],
            "widths": None if widths is None else {4 * 2 ** i: w for i, w in enumerate(widths)}}
    return BigGANGenerator, {
        "resolution": gan["resolution"], "latent_dim": spec["latent_dim"],
        "channel_width": spec["channel_width"], "num_classes": spec["num_classes"],
        "widths": None if widths is None else tuple(widths),
        "attention_resolution": spec["attention_resolution"], "truncation": spec["truncation"]}
