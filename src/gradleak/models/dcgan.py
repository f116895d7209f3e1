"""DCGAN generator and discriminator (Radford et al., 2016) for 32x32 or 64x64 images.

The generator maps z ~ N(0, I) of size ``latent_dim`` (100, as in GIAS) to an
image in [-1, 1] (tanh); attacks map it to [0, 1] by (x + 1) / 2. At 64x64 it is the
paper's architecture (§3-4, Fig. 1): a 4x4 projection to 8 x ``width`` channels, then
fractionally strided 4x4 convolutions halving the channels and doubling the size (8, 16,
32) to the image, batch norm and ReLU between, tanh at the output; the discriminator
mirrors it with strided convolutions and leaky ReLU (0.2), no batch norm on its first
layer. At 32x32 (``resolution`` 32, the default) the first upsampling block is dropped
(a projection to 4 x ``width`` channels), as in GIAS's CIFAR-10 DCGAN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

RESOLUTIONS = (32, 64)


def _multiplier(resolution: int) -> int:
    """The channel multiple of ``width`` after the 4x4 projection: 4 at 32x32, 8 at 64x64."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"DCGAN resolution must be one of {RESOLUTIONS}, got {resolution!r}")
    return resolution // 8


class Generator(nn.Module):
    def __init__(self, latent_dim: int = 100, channels: int = 3, width: int = 64,
                 resolution: int = 32) -> None:
        super().__init__()
        self.latent_dim, self.resolution = latent_dim, resolution
        mult = _multiplier(resolution)
        layers: list[nn.Module] = [nn.ConvTranspose2d(latent_dim, width * mult, 4, 1, 0,
                                                      bias=False),
                                   nn.BatchNorm2d(width * mult), nn.ReLU(True)]
        while mult > 1:
            layers += [nn.ConvTranspose2d(width * mult, width * mult // 2, 4, 2, 1, bias=False),
                       nn.BatchNorm2d(width * mult // 2), nn.ReLU(True)]
            mult //= 2
        layers += [nn.ConvTranspose2d(width, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.view(z.shape[0], self.latent_dim, 1, 1))


class Discriminator(nn.Module):
    def __init__(self, channels: int = 3, width: int = 64, resolution: int = 32) -> None:
        super().__init__()
        top = _multiplier(resolution)
        layers: list[nn.Module] = [nn.Conv2d(channels, width, 4, 2, 1, bias=False),
                                   nn.LeakyReLU(0.2, True)]
        mult = 1
        while mult < top:
            layers += [nn.Conv2d(width * mult, width * mult * 2, 4, 2, 1, bias=False),
                       nn.BatchNorm2d(width * mult * 2), nn.LeakyReLU(0.2, True)]
            mult *= 2
        layers.append(nn.Conv2d(width * top, 1, 4, 1, 0, bias=False))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).view(-1)


def init_weights(module: nn.Module) -> None:
    """DCGAN initialisation: N(0, 0.02) convolutions, N(1, 0.02) batch-norm scales."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def untrained_generator(latent_dim: int, channels: int, width: int, seed: int,
                        resolution: int = 32) -> Generator:
    """A generator of the prior's architecture with DCGAN's initial weights drawn from
    ``seed``, not trained (GIAS Table 1's GI-w "untrained"), in eval mode."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = Generator(latent_dim, channels, width, resolution)
        net.apply(init_weights)
    return net.eval()


def train_dcgan(images: torch.Tensor, *, epochs: int, batch_size: int, lr: float,
                latent_dim: int, width: int, seed: int, progress: bool = True,
                keep: Callable[[dict], None] | None = None, resume_from: dict | None = None
                ) -> tuple[Generator, list[dict]]:
    """Non-saturating GAN training (Goodfellow et al., 2014) with DCGAN's Adam (beta1 = 0.5);
    DCGAN's lr 2e-4, 25 epochs and batch 64 are the schema's defaults (``gan:``).

    ``images`` are in [0, 1], 32x32 or 64x64 (the networks' resolution); they are mapped
    to [-1, 1] for the tanh generator. Both
    networks train on ``images``' device (initialised on the CPU, the same weights on every
    device), the shuffles and latent codes drawn there.
    Returns the generator (eval mode) and the mean losses per epoch. ``keep(state)`` is
    handed the whole training state after each epoch; ``resume_from``, such a state,
    continues from there as if nothing had stopped (``experiment.resume``).
    """
    from tqdm import tqdm

    device = images.device
    rng = torch.Generator(device=device).manual_seed(seed)
    torch.manual_seed(seed)
    g_net = Generator(latent_dim, images.shape[1], width, images.shape[-1])
    d_net = Discriminator(images.shape[1], width, images.shape[-1])
    g_net.apply(init_weights)
    d_net.apply(init_weights)
    g_net, d_net = g_net.to(device), d_net.to(device)
    g_opt = torch.optim.Adam(g_net.parameters(), lr=lr, betas=(0.5, 0.999))
    d_opt = torch.optim.Adam(d_net.parameters(), lr=lr, betas=(0.5, 0.999))
    bce = nn.functional.binary_cross_entropy_with_logits
    data = images * 2 - 1
    log: list[dict] = []
    nets, optimizers = {"g": g_net, "d": d_net}, {"g_opt": g_opt, "d_opt": d_opt}
    first = 0
    if resume_from is not None:
        first = resume_from["epoch"]
        for name, part in {**nets, **optimizers}.items():
            part.load_state_dict(resume_from[name])
        rng.set_state(resume_from["rng"])
        log += resume_from["log"]
    for epoch in tqdm(range(first, epochs), desc="dcgan", initial=first, total=epochs,
                      disable=not progress, leave=False):
        order = torch.randperm(len(data), generator=rng, device=device)
        d_total, g_total, steps = 0.0, 0.0, 0
        for start in range(0, len(data), batch_size):
            real = data[order[start:start + batch_size]]
            fake = g_net(torch.randn(len(real), latent_dim, generator=rng, device=device))
            ones = torch.ones(len(real), device=device)
            d_loss = (bce(d_net(real), ones)
                      + bce(d_net(fake.detach()), torch.zeros(len(real), device=device)))
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
            g_loss = bce(d_net(fake), ones)
            g_opt.zero_grad()
            g_loss.backward()
            g_opt.step()
            d_total, g_total, steps = d_total + d_loss.item(), g_total + g_loss.item(), steps + 1
        log.append({"epoch": epoch, "d_loss": d_total / steps, "g_loss": g_total / steps})
        if keep is not None:
            keep({"epoch": epoch + 1, "rng": rng.get_state(), "log": log,
                  **{name: part.state_dict() for name, part in {**nets, **optimizers}.items()}})
    return g_net.eval(), log


def load_generator(path, step: int | None = None) -> Generator:
    """The generator saved by ``gradleak train-gan`` or ``train-giml`` (state dict + sizes),
    in eval mode; with ``step``, GIML's checkpoint of that outer step (``checkpoints``)."""
    from gradleak.utils.io import REMEDY, ArtifactError, load_state, load_torch

    saved = load_torch(path)
    try:
        net = Generator(saved["latent_dim"], saved["channels"], saved["width"],
                        saved.get("resolution", 32))
        state = saved["generator"]
    except (KeyError, TypeError, IndexError, ValueError) as err:
        raise ArtifactError(f"{path} is not a saved generator (expected a dict of generator, "
                            f"latent_dim, channels and width; bad or missing {err}); {REMEDY}"
                            ) from None
    if step is not None:
        kept = saved.get("checkpoints") or {}
        if step not in kept:
            raise ArtifactError(f"{path} holds no generator of GIML step {step} (it holds "
                                f"steps {sorted(kept)}: 'giml.checkpoints' when it was "
                                f"written); {REMEDY}")
        state = kept[step]
    what = "the generator" if step is None else f"the generator of step {step}"
    return load_state(net, state, path, what).eval()
