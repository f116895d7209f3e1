"""The configuration's generator priors (``gan:``) as the GAN-based attacks receive them.

``gan.kind`` ``dcgan`` is trained in the pipeline (``rule train_gan``, the ``gan``
artifact's file ``results/gan/<dataset>.pt``) for every dataset a prior is of;
``stylegan2`` (Karras et al. 2020) and ``biggan`` (BigGAN-deep, Brock et al. 2019) are
pretrained: the prior of ``gan.dataset`` (and of each dataset in ``gan.by_dataset``, with
its own kind and file) is the local weights file itself, which the attack jobs take as an
input (no ``train_gan`` job), loaded key for key in the public PyTorch ports' formats
(``models.stylegan2.load_stylegan2``: rosinality/stylegan2-pytorch's ``g_ema``;
``models.biggan.load_biggan``: huggingface pytorch-pretrained-BigGAN's
``pytorch_model.bin``) and handed to the attacks as ``attacks.prior.StyleGAN2Prior`` /
``BigGANPrior`` with the searched space and class map of the configuration; a prior of any
other dataset (an attack's ``prior_dataset``, GIAS Fig. 6's wrong prior) is a DCGAN trained
here. A missing weights file, one whose keys or shapes do not fit the configured
architecture (its tensors mapped, not read), or architecture settings the generator's
constructor refuses, stop Snakemake before any job (``problem``, called by
``workflow/rules/common.smk``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from gradleak.attacks.prior import BigGANPrior, GeneratorPrior, StyleGAN2Prior
from gradleak.config import ConfigError
from gradleak.models.biggan import load_biggan
from gradleak.models.ported import architecture
from gradleak.models.stylegan2 import load_stylegan2
from gradleak.utils.io import ArtifactError

FORMATS = {"stylegan2": "a rosinality/stylegan2-pytorch checkpoint holding 'g_ema', or the "
                        "bare g_ema state dict",
           "biggan": "huggingface pytorch-pretrained-BigGAN's pytorch_model.bin"}
LOADERS = {"stylegan2": load_stylegan2, "biggan": load_biggan}


def pretrained(config: dict) -> bool:
    """Whether ``gan.kind`` is a pretrained kind (else every prior is a DCGAN trained here)."""
    return config["gan"]["kind"] != "dcgan"


def pretrained_datasets(config: dict) -> list[str]:
    """The datasets whose prior is loaded from a weights file: ``gan.dataset`` and those of
    ``gan.by_dataset``, in that order; none with the DCGAN."""
    gan = config["gan"]
    if not pretrained(config):
        return []
    return [gan["dataset"], *sorted(set(gan["by_dataset"]) - {gan["dataset"]})]


def spec(config: dict, dataset: str | None = None) -> dict:
    """The generator settings of the prior of ``dataset`` (None: ``gan.dataset``): its
    ``gan.by_dataset`` entry over ``gan:``, ``gan:`` itself, or, for a dataset with no
    pretrained prior, ``gan:`` as a DCGAN trained here."""
    gan = config["gan"]
    dataset = dataset or gan["dataset"]
    if dataset not in pretrained_datasets(config):
        return {**gan, "kind": "dcgan", "weights": None}
    return {**gan, **gan["by_dataset"].get(dataset, {})}


def _key(config: dict, dataset: str) -> str:
    """The configuration path of ``dataset``'s pretrained prior."""
    return f"gan.by_dataset.{dataset}" if dataset in config["gan"]["by_dataset"] else "gan"


def weights(config: dict, dataset: str | None = None) -> Path:
    """The weights file of ``dataset``'s pretrained prior (``gan.weights``, or its
    ``gan.by_dataset`` entry's)."""
    return Path(spec(config, dataset)["weights"])


def problem(config: dict) -> str | None:
    """What stops the run before any job, or None: a pretrained prior's architecture
    settings that its constructor refuses (built on the meta device: no memory, no weights
    drawn), its weights file absent, named with where it comes from (``source``) and the
    way to run on DCGANs instead, or a file that does not fit the architecture (unreadable,
    or its first missing, unexpected or mis-shaped key; no tensor data read). The DCGAN
    has none."""
    for dataset in pretrained_datasets(config):
        gan, key = spec(config, dataset), _key(config, dataset)
        kind = gan["kind"]
        build, arguments = architecture(gan)
        try:
            with torch.device("meta"):
                build(**arguments)
        except ValueError as error:
            return f"invalid config: '{key}.{kind}': {error}"
        if not Path(gan["weights"]).is_file():
            source = f"; from {gan['source']}" if gan["source"] else ""
            return (f"{key}.weights: {gan['weights']!r} does not exist ({kind} loads "
                    f"{dataset}'s generator from it: expected {FORMATS[kind]}, "
                    f"downloaded to that path{source}); or run DCGANs trained here: "
                    f"--config 'gan={{kind: dcgan}}'")
        try:
            LOADERS[kind](Path(gan["weights"]), check_only=True, **arguments)
        except ArtifactError as error:
            return f"{key}.weights: {error}"
    return None


def _wrapped(gan: dict, net: torch.nn.Module) -> GeneratorPrior:
    if gan["kind"] == "stylegan2":
        return StyleGAN2Prior(net, gan["stylegan2"]["space"])
    return BigGANPrior(net, gan["biggan"]["classes"])


def load(config: dict, dataset: str | None = None) -> GeneratorPrior:
    """The pretrained prior of ``dataset`` (None: ``gan.dataset``) from its weights file
    (ArtifactError naming the file and the first key that does not fit the configured
    architecture)."""
    gan = spec(config, dataset)
    _, arch = architecture(gan)
    return _wrapped(gan, LOADERS[gan["kind"]](Path(gan["weights"]), **arch))


def untrained(config: dict, dataset: str | None = None) -> GeneratorPrior:
    """The architecture of ``dataset``'s pretrained prior with its constructors' initial
    weights drawn from ``gan.seed``, untrained (GIAS Table 1's GI-w "untrained"), in eval
    mode."""
    gan = spec(config, dataset)
    build, arch = architecture(gan)
    with torch.random.fork_rng():
        torch.manual_seed(gan["seed"])
        net = build(**arch)
    return _wrapped(gan, net.eval())


def check(config: dict) -> None:
    """ConfigError unless the generator priors' settings fit their kinds: a DCGAN 32x32 or
    64x64; a pretrained prior's weights file named, its resolution and widths ones its
    architecture has, BigGAN's classes among its classes (the rest of the architecture:
    :func:`problem`, before any job); ``gan.split`` a split of ``gan.dataset``."""
    gan = config["gan"]
    fractions = config["datasets"].get(gan["dataset"], {}).get("splits") or {"all": 1}
    if gan["split"] not in fractions:
        raise ConfigError(f"invalid config: 'gan.split': {gan['split']!r} is not a split of "
                          f"'datasets.{gan['dataset']}.splits'; expected one of "
                          f"{sorted(fractions)}")
    if not pretrained(config) and gan["resolution"] not in (32, 64):
        raise ConfigError(f"invalid config: 'gan.resolution': {gan['resolution']!r} is not a "
                          f"DCGAN size; expected 32 or 64", key="gan.resolution")
    for dataset in pretrained_datasets(config):
        _check_pretrained(spec(config, dataset), _key(config, dataset))


def _check_pretrained(gan: dict, key: str) -> None:
    kind, size = gan["kind"], gan["resolution"]
    if gan["weights"] is None:
        raise ConfigError(f"invalid config: '{key}.weights': gan.kind {kind} is pretrained; "
                          f"expected the path of its local weights file", key=f"{key}.weights")
    arch, steps = gan[kind], size.bit_length() - 1
    lowest = 4 if kind == "stylegan2" else 8
    if size < lowest or size != 2 ** steps:
        raise ConfigError(f"invalid config: '{key}.resolution': {size!r} is not a {kind} size; "
                          f"expected a power of 2, at least {lowest}", key=f"{key}.resolution")
    count = steps - 1  # one width per resolution 4, 8, ..., size
    if arch["widths"] is not None and len(arch["widths"]) != count:
        raise ConfigError(f"invalid config: '{key}.{kind}.widths': {len(arch['widths'])} "
                          f"widths; expected {count}, one per resolution 4..{size}",
                          key=f"{key}.{kind}.widths")
    if kind == "biggan" and arch["widths"] is None and size not in (128, 256, 512):
        raise ConfigError(f"invalid config: '{key}.biggan.widths': null (the port's) needs "
                          f"'{key}.resolution' 128, 256 or 512, got {size}; expected {count} "
                          f"widths", key=f"{key}.biggan.widths")
    classes = [c for c in (arch.get("classes") or []) if c >= arch["num_classes"]]
    if classes:
        raise ConfigError(f"invalid config: '{key}.biggan.classes': class {classes[0]} is not "
                          f"one of the generator's; expected 0..{arch['num_classes'] - 1} "
                          f"('{key}.biggan.num_classes')", key=f"{key}.biggan.classes")
