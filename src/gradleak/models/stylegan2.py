"""StyleGAN2's generator (Karras et al., "Analyzing and Improving the Image Quality of
StyleGAN", CVPR 2020), loadable from the weights of the public PyTorch port
rosinality/stylegan2-pytorch (its ``g_ema`` state dict, key for key).

Where the papers use it: GIAS (Jeon et al., 2021) searches a StyleGAN2 trained on ImageNet
64x64 (§5 and App. H: the latent search of Eq. 5, then the generator's parameters, Eq. 7);
GGL (Li et al., 2022) and GIFD (Fang et al., 2023) use StyleGAN2 on FFHQ, GIFD searching
the intermediate features between synthesis blocks; CENSOR (§V-A, "Attacks
Configurations") attacks with GGL's and GIFD's StyleGAN2 priors.

The architecture (StyleGAN2 §2, Fig. 2d; the skip generator of §4.1, Fig. 7b, its
configs E/F):

- mapping network z -> w (StyleGAN, Karras et al. 2019, §2): pixel norm, then ``n_mlp``
  (8) equalised-learning-rate linear layers (weights drawn N(0, 1/lr_mul^2), scaled at
  run time by lr_mul / sqrt(fan_in), lr_mul = 0.01) with leaky ReLU (0.2) times sqrt(2);
- synthesis: a learned constant 4x4 input, per resolution two 3x3 modulated convolutions
  (weights scaled by the style s = affine(w) per input channel, then demodulated by
  1/sqrt(sum w'^2 + 1e-8), §2.2 Eq. 1-3; the first of each resolution upsamples by a
  stride-2 transposed convolution followed by a [1, 3, 3, 1] FIR blur), each followed by
  noise injection (a learned per-layer strength times a per-pixel noise map), a bias and
  leaky ReLU times sqrt(2); a 1x1 modulated ToRGB (not demodulated) per resolution whose
  outputs are summed through FIR-upsampled skips.

Noise maps are the fixed buffers ``noises.noise_<i>`` of the checkpoint (the port's
``randomize_noise=False``), so a latent always renders the same image. ``n_latent`` =
2 log2(resolution) - 2 style inputs; ``forward(z)`` broadcasts one w to all of them.

Output range: the port's synthesis emits images centred on [-1, 1] without a final
non-linearity; ``forward`` returns ((x + 1) / 2).clamp(0, 1), images in [0, 1];
``synthesis`` returns the port's raw output.

Spaces the attacks search: ``mapping(z) -> w`` (GIAS's z; w, a (B, latent) code, or w+,
(B, n_latent, latent)), ``synthesis(ws)``, and the synthesis blocks for GIFD: block 0 is
the constant input, its convolution and ToRGB (4x4); block k >= 1 doubles the resolution.
``block(k, ws, state)`` maps a state (features, rgb skip) to the next; ``blocks`` is
their number. The checkpoint's ``latent_avg`` (truncation) is not used: the attacks
search the untruncated prior.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from gradleak.models.port_state import load_port_state

SQRT2 = math.sqrt(2.0)
BLUR = (1.0, 3.0, 3.0, 1.0)


def port_widths(resolution: int, channel_multiplier: int = 2) -> dict[int, int]:
    """The port's channels per resolution: 512 up to 32x32, then 256, 128, 64, 32, 16 times
    ``channel_multiplier`` (2 for the FFHQ/ImageNet configs E/F)."""
    table = {4: 512, 8: 512, 16: 512, 32: 512, 64: 256 * channel_multiplier,
             128: 128 * channel_multiplier, 256: 64 * channel_multiplier,
             512: 32 * channel_multiplier, 1024: 16 * channel_multiplier}
    return {r: w for r, w in table.items() if r <= resolution}


def fir_kernel(taps) -> torch.Tensor:
    k = torch.tensor(taps, dtype=torch.float32)
    k = torch.outer(k, k)
    return k / k.sum()


def upfirdn2d(x: torch.Tensor, kernel: torch.Tensor, up: int = 1,
              pad: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """Upsample by zero insertion (``up``), zero-pad every side by ``pad`` (before, after),
    then filter each channel with ``kernel`` (flipped: a true convolution)."""
    b, c, h, w = x.shape
    if up > 1:
        x = F.pad(x.view(b, c, h, 1, w, 1), [0, up - 1, 0, 0, 0, up - 1])
        x = x.view(b, c, h * up, w * up)
    x = F.pad(x, [pad[0], pad[1], pad[0], pad[1]])
    weight = torch.flip(kernel, [0, 1]).to(x.dtype).expand(c, 1, *kernel.shape)
    return F.conv2d(x, weight, groups=c)


class Blur(nn.Module):
    def __init__(self, pad: tuple[int, int], upsample_factor: int = 1) -> None:
        super().__init__()
        self.register_buffer("kernel", fir_kernel(BLUR) * upsample_factor ** 2)
        self.pad = pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upfirdn2d(x, self.kernel, pad=self.pad)


class Upsample(nn.Module):
    """2x FIR upsampling of the ToRGB skip."""

    def __init__(self, factor: int = 2) -> None:
        super().__init__()
        self.register_buffer("kernel", fir_kernel(BLUR) * factor ** 2)
        p = len(BLUR) - factor
        self.factor, self.pad = factor, ((p + 1) // 2 + factor - 1, p // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upfirdn2d(x, self.kernel, up=self.factor, pad=self.pad)


class EqualLinear(nn.Module):
    """Equalised learning rate linear layer (Karras et al. 2018 §4.1), optionally followed
    by leaky ReLU (0.2) times sqrt(2) after the bias."""

    def __init__(self, in_dim: int, out_dim: int, bias_init: float = 0.0, lr_mul: float = 1.0,
                 activation: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_dim, in_dim) / lr_mul)
        self.bias = nn.Parameter(torch.full((out_dim,), float(bias_init)))
        self.scale, self.lr_mul, self.activation = lr_mul / math.sqrt(in_dim), lr_mul, activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight * self.scale, self.bias * self.lr_mul)
        return F.leaky_relu(out, 0.2) * SQRT2 if self.activation else out


class PixelNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-8)


class ModulatedConv2d(nn.Module):
    """StyleGAN2 §2.2: weights modulated per sample by s = affine(w) (bias initialised to 1),
    demodulated to unit output variance (Eq. 3), as one grouped convolution."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, style_dim: int,
                 demodulate: bool = True, upsample: bool = False) -> None:
        super().__init__()
        self.in_ch, self.out_ch, self.kernel = in_ch, out_ch, kernel
        self.demodulate, self.upsample = demodulate, upsample
        self.scale = 1 / math.sqrt(in_ch * kernel ** 2)
        self.padding = kernel // 2
        self.weight = nn.Parameter(torch.randn(1, out_ch, in_ch, kernel, kernel))
        self.modulation = EqualLinear(style_dim, in_ch, bias_init=1.0)
        if upsample:
            p = (len(BLUR) - 2) - (kernel - 1)
            self.blur = Blur(((p + 1) // 2 + 1, p // 2 + 1), upsample_factor=2)

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        s = self.modulation(style).view(b, 1, c, 1, 1)
        weight = self.scale * self.weight * s
        if self.demodulate:
            weight = weight * torch.rsqrt(weight.pow(2).sum([2, 3, 4]) + 1e-8).view(
                b, self.out_ch, 1, 1, 1)
        x = x.reshape(1, b * c, h, w)
        if self.upsample:
            weight = weight.transpose(1, 2).reshape(b * c, self.out_ch, self.kernel, self.kernel)
            out = F.conv_transpose2d(x, weight, padding=0, stride=2, groups=b)
            return self.blur(out.view(b, self.out_ch, *out.shape[-2:]))
        out = F.conv2d(x, weight.view(b * self.out_ch, c, self.kernel, self.kernel),
                       padding=self.padding, groups=b)
        return out.view(b, self.out_ch, *out.shape[-2:])


class NoiseInjection(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return x + self.weight * noise


class FusedLeakyReLU(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x + self.bias.view(1, -1, 1, 1), 0.2) * SQRT2


class StyledConv(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, style_dim: int, upsample: bool = False) -> None:
        super().__init__()
        self.conv = ModulatedConv2d(in_ch, out_ch, 3, style_dim, upsample=upsample)
        self.noise = NoiseInjection()
        self.activate = FusedLeakyReLU(out_ch)

    def forward(self, x: torch.Tensor, style: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.activate(self.noise(self.conv(x, style), noise))


class ToRGB(nn.Module):
    def __init__(self, in_ch: int, style_dim: int, upsample: bool = True) -> None:
        super().__init__()
        if upsample:
            self.upsample = Upsample()
        self.conv = ModulatedConv2d(in_ch, 3, 1, style_dim, demodulate=False)
        self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))

    def forward(self, x: torch.Tensor, style: torch.Tensor,
                skip: torch.Tensor | None = None) -> torch.Tensor:
        out = self.conv(x, style) + self.bias
        return out if skip is None else out + self.upsample(skip)


class ConstantInput(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.input = nn.Parameter(torch.randn(1, channels, 4, 4))

    def forward(self, batch: int) -> torch.Tensor:
        return self.input.expand(batch, -1, -1, -1)


class StyleGAN2Generator(nn.Module):
    """See the module docstring. ``widths`` maps each resolution 4, 8, ..., ``resolution``
    to its channels (default: the port's, ``port_widths``); ``latent_dim`` is the size of
    z and w (512), ``n_mlp`` the mapping depth (8), ``lr_mlp`` its learning-rate multiplier
    (0.01)."""

    def __init__(self, resolution: int, latent_dim: int = 512, n_mlp: int = 8,
                 channel_multiplier: int = 2, lr_mlp: float = 0.01,
                 widths: dict[int, int] | None = None) -> None:
        super().__init__()
        log_size = int(math.log2(resolution)) if resolution >= 4 else 0
        if log_size < 2 or 2 ** log_size != resolution:
            raise ValueError(f"StyleGAN2 resolution must be a power of 2, at least 4; "
                             f"got {resolution!r}")
        widths = dict(port_widths(resolution, channel_multiplier) if widths is None else widths)
        needed = [2 ** i for i in range(2, log_size + 1)]
        if sorted(widths) != needed or not all(isinstance(w, int) and w > 0
                                               for w in widths.values()):
            raise ValueError(f"StyleGAN2 widths must give a positive channel count for each "
                             f"resolution {needed}; got {widths!r}")
        if not (isinstance(latent_dim, int) and latent_dim > 0 and isinstance(n_mlp, int)
                and n_mlp > 0):
            raise ValueError(f"StyleGAN2 latent_dim and n_mlp must be positive integers; got "
                             f"{latent_dim!r} and {n_mlp!r}")
        self.resolution, self.latent_dim, self.widths = resolution, latent_dim, widths
        self.style = nn.Sequential(PixelNorm(), *[
            EqualLinear(latent_dim, latent_dim, lr_mul=lr_mlp, activation=True)
            for _ in range(n_mlp)])
        self.input = ConstantInput(widths[4])
        self.conv1 = StyledConv(widths[4], widths[4], latent_dim)
        self.to_rgb1 = ToRGB(widths[4], latent_dim, upsample=False)
        self.convs, self.to_rgbs = nn.ModuleList(), nn.ModuleList()
        self.noises = nn.Module()
        for i in range((log_size - 2) * 2 + 1):
            size = 2 ** ((i + 5) // 2)
            self.noises.register_buffer(f"noise_{i}", torch.randn(1, 1, size, size))
        in_ch = widths[4]
        for res in needed[1:]:
            self.convs.append(StyledConv(in_ch, widths[res], latent_dim, upsample=True))
            self.convs.append(StyledConv(widths[res], widths[res], latent_dim))
            self.to_rgbs.append(ToRGB(widths[res], latent_dim))
            in_ch = widths[res]
        self.n_latent = log_size * 2 - 2
        self.blocks = log_size - 1

    def mapping(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, latent) -> w (B, latent)."""
        return self.style(z)

    def _styles(self, ws: torch.Tensor) -> torch.Tensor:
        """w (B, latent) or w+ (B, n_latent, latent) -> (B, n_latent, latent)."""
        if ws.dim() == 2:
            return ws.unsqueeze(1).expand(-1, self.n_latent, -1)
        if ws.dim() != 3 or ws.shape[1] != self.n_latent:
            raise ValueError(f"StyleGAN2 styles must be (B, {self.latent_dim}) or "
                             f"(B, {self.n_latent}, {self.latent_dim}); got {tuple(ws.shape)}")
        return ws

    def block(self, k: int, ws: torch.Tensor,
              state: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Synthesis block ``k`` on ``state`` = (features, rgb skip) (none for block 0);
        returns the next state. Block k uses styles 2k - 1 .. 2k + 1 (block 0: 0 and 1)."""
        ws = self._styles(ws)
        noise = [getattr(self.noises, f"noise_{i}") for i in range(2 * self.blocks - 1)]
        if k == 0:
            x = self.conv1(self.input(ws.shape[0]), ws[:, 0], noise[0])
            return x, self.to_rgb1(x, ws[:, 1])
        x, skip = state
        i = 2 * k - 1
        x = self.convs[i - 1](x, ws[:, i], noise[i])
        x = self.convs[i](x, ws[:, i + 1], noise[i + 1])
        return x, self.to_rgbs[k - 1](x, ws[:, i + 2], skip)

    def synthesis(self, ws: torch.Tensor, start: int = 0,
                  state: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Blocks ``start`` .. end from ``state`` (from the constant input when start is 0):
        the port's raw image, centred on [-1, 1]."""
        for k in range(start, self.blocks):
            state = self.block(k, ws, state)
        return state[1]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, latent) ~ N(0, I) -> images (B, 3, resolution, resolution) in [0, 1]."""
        return ((self.synthesis(self.mapping(z)) + 1) / 2).clamp(0, 1)


def load_stylegan2(path: str | os.PathLike, resolution: int, latent_dim: int = 512,
                   n_mlp: int = 8, channel_multiplier: int = 2,
                   widths: dict[int, int] | None = None,
                   check_only: bool = False) -> StyleGAN2Generator:
    """The generator in ``path``: a rosinality/stylegan2-pytorch checkpoint (a dict with
    ``g_ema``, as its ``convert_weight.py`` writes; other entries such as ``latent_avg``
    are ignored) or a bare ``g_ema`` state dict, read with ``weights_only=True``; eval mode.
    A training checkpoint of the port also pickles its argparse ``args``, which
    ``weights_only`` refuses: save ``{"g_ema": ckpt["g_ema"]}`` from it first.
    ``check_only``: the file's keys and shapes checked against a net on the meta device,
    no tensor data read (``load_port_state``)."""
    with torch.device("meta") if check_only else contextlib.nullcontext():
        net = StyleGAN2Generator(resolution, latent_dim, n_mlp, channel_multiplier,
                                 widths=widths)
    what = (f"the StyleGAN2 generator (rosinality/stylegan2-pytorch 'g_ema' layout, "
            f"resolution {resolution}, latent {latent_dim}, {n_mlp} mapping layers, "
            f"widths {net.widths})")
    return load_port_state(net, path, what, container="g_ema", check_only=check_only)
