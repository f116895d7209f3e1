"""The configuration's generator prior (``gan:``) as the GAN-based attacks receive it.

``gan.kind`` ``dcgan`` is trained in the pipeline (``rule train_gan``, the ``gan``
artifact's file ``results/gan/<dataset>.pt``); ``stylegan2`` (Karras et al. 2020) and
``biggan`` (BigGAN-deep, Brock et al. 2019) are pretrained: their artifact's file is the
local weights file ``gan.weights`` itself, which the attack jobs take as an input (no
``train_gan`` job), loaded key for key in the public PyTorch ports' formats
(``models.stylegan2.load_stylegan2``: rosinality/stylegan2-pytorch's ``g_ema``;
``models.biggan.load_biggan``: huggingface pytorch-pretrained-BigGAN's
``pytorch_model.bin``) and handed to the attacks as ``attacks.prior.StyleGAN2Prior`` /
``BigGANPrior`` with the searched space and class map of the configuration. A missing
weights file, or architecture settings the generator's constructor refuses, stop
Snakemake before any job (``problem``, called by ``workflow/rules/common.smk``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from fedleak.attacks.prior import BigGANPrior, GeneratorPrior, StyleGAN2Prior
from fedleak.config import ConfigError
from fedleak.models.biggan import load_biggan
from fedleak.models.ported import architecture
from fedleak.models.stylegan2 import load_stylegan2

FORMATS = {"stylegan2": "a rosinality/stylegan2-pytorch checkpoint holding 'g_ema', or the "
                        "bare g_ema state dict",
           "biggan": "huggingface pytorch-pretrained-BigGAN's pytorch_model.bin"}


def pretrained(config: dict) -> bool:
    """Whether the prior is loaded from ``gan.weights`` rather than trained here."""
    return config["gan"]["kind"] != "dcgan"


def weights(config: dict) -> Path:
    """The pretrained prior's weights file (``gan.weights``)."""
    return Path(config["gan"]["weights"])


def problem(config: dict) -> str | None:
    """What stops the run before any job, or None: a pretrained kind's architecture settings
    that its constructor refuses (built on the meta device: no memory, no weights drawn),
    or its weights file ``gan.weights`` absent. The DCGAN has none."""
    if not pretrained(config):
        return None
    kind = config["gan"]["kind"]
    build, arguments = architecture(config["gan"])
    try:
        with torch.device("meta"):
            build(**arguments)
    except ValueError as error:
        return f"invalid config: 'gan.{kind}': {error}"
    if weights(config).is_file():
        return None
    return (f"gan.weights: {str(weights(config))!r} does not exist (gan.kind {kind} loads its "
            f"generator from it: expected {FORMATS[kind]}, downloaded to that path)")


def _wrapped(config: dict, net: torch.nn.Module) -> GeneratorPrior:
    gan = config["gan"]
    if gan["kind"] == "stylegan2":
        return StyleGAN2Prior(net, gan["stylegan2"]["space"])
    return BigGANPrior(net, gan["biggan"]["classes"])


def load(config: dict) -> GeneratorPrior:
    """The pretrained prior from ``gan.weights`` (ArtifactError naming the file and the
    first key that does not fit the configured architecture)."""
    _, arch = architecture(config["gan"])
    loader = load_stylegan2 if config["gan"]["kind"] == "stylegan2" else load_biggan
    return _wrapped(config, loader(weights(config), **arch))


def untrained(config: dict) -> GeneratorPrior:
    """The pretrained kind's architecture with its constructors' initial weights drawn from
    ``gan.seed``, untrained (GIAS Table 1's GI-w "untrained"), in eval mode."""
    build, arch = architecture(config["gan"])
    with torch.random.fork_rng():
        torch.manual_seed(config["gan"]["seed"])
        net = build(**arch)
    return _wrapped(config, net.eval())


def check(config: dict) -> None:
    """ConfigError unless the generator prior's settings fit its kind: a DCGAN 32x32 or 64x64
    and trained here (no weights); a pretrained kind's weights file named, its resolution
    and widths ones its architecture has, BigGAN's classes among its classes (the rest of
    the architecture: :func:`problem`, before any job); ``gan.split`` a split of
    ``gan.dataset``."""
    gan = config["gan"]
    fractions = config["datasets"].get(gan["dataset"], {}).get("splits") or {"all": 1}
    if gan["split"] not in fractions:
        raise ConfigError(f"invalid config: 'gan.split': {gan['split']!r} is not a split of "
                          f"'datasets.{gan['dataset']}.splits'; expected one of "
                          f"{sorted(fractions)}")
    kind, size = gan["kind"], gan["resolution"]
    if kind == "dcgan":
        if size not in (32, 64):
            raise ConfigError(f"invalid config: 'gan.resolution': {size!r} is not a DCGAN size; "
                              f"expected 32 or 64", key="gan.resolution")
        if gan["weights"] is not None:
            raise ConfigError(f"invalid config: 'gan.weights': the dcgan prior is trained in the "
                              f"pipeline; expected null, or gan.kind stylegan2 or biggan for "
                              f"{gan['weights']!r}", key="gan.weights")
        return
    if gan["weights"] is None:
        raise ConfigError(f"invalid config: 'gan.weights': gan.kind {kind} is pretrained; "
                          f"expected the path of its local weights file", key="gan.weights")
    spec, steps = gan[kind], size.bit_length() - 1
    lowest = 4 if kind == "stylegan2" else 8
    if size < lowest or size != 2 ** steps:
        raise ConfigError(f"invalid config: 'gan.resolution': {size!r} is not a {kind} size; "
                          f"expected a power of 2, at least {lowest}", key="gan.resolution")
    count = steps - 1  # one width per resolution 4, 8, ..., size
    if spec["widths"] is not None and len(spec["widths"]) != count:
        raise ConfigError(f"invalid config: 'gan.{kind}.widths': {len(spec['widths'])} widths; "
                          f"expected {count}, one per resolution 4..{size}",
                          key=f"gan.{kind}.widths")
    if kind == "biggan" and spec["widths"] is None and size not in (128, 256, 512):
        raise ConfigError(f"invalid config: 'gan.biggan.widths': null (the port's) needs "
                          f"'gan.resolution' 128, 256 or 512, got {size}; expected {count} "
                          f"widths", key="gan.biggan.widths")
    classes = [c for c in (spec.get("classes") or []) if c >= spec["num_classes"]]
    if classes:
        raise ConfigError(f"invalid config: 'gan.biggan.classes': class {classes[0]} is not "
                          f"one of the generator's; expected 0..{spec['num_classes'] - 1} "
                          f"('gan.biggan.num_classes')", key="gan.biggan.classes")
