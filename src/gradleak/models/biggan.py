"""BigGAN's generator (Brock et al., "Large Scale GAN Training for High Fidelity Natural
Image Synthesis", ICLR 2019), in its BigGAN-deep form, loadable from the weights of the
public PyTorch port huggingface/pytorch-pretrained-BigGAN (``pytorch_model.bin``, a state
dict converted from DeepMind's TF Hub ``biggan-deep-128/256/512``), key for key.

Where the papers use it: GGL (Li et al., 2022) searches BigGAN's latent space on ImageNet
and CIFAR-10; GIFD (Fang et al., 2023) its intermediate features; CENSOR (§V-A, "Attacks
Configurations") attacks ImageNet 64x64 with both.

The architecture (BigGAN §3 and App. B, Fig. 16 / Table 5 "BigGAN-deep"): class-
conditional through a shared class embedding (a bias-free linear map of the one-hot class,
``embeddings``) concatenated with the whole z, the conditioning vector every block
receives (BigGAN-deep feeds the whole z to every block instead of BigGAN's z chunks, App.
B); a spectrally normalised linear layer to a 4x4x(16 ch) tensor; residual bottleneck
blocks (conditional BatchNorm, ReLU, 1x1 conv to ch/4, [nearest 2x upsampling], two 3x3
convs, 1x1 conv back; the skip drops channels and upsamples), two per resolution, the
second upsampling; one self-attention block (SAGAN, Zhang et al. 2019) before the first
block at ``attention_resolution`` (64); BatchNorm, ReLU, 3x3 conv to RGB, tanh.

Conditional BatchNorm (§3 "shared embedding"): gains 1 + scale(c) and biases offset(c),
linear in the conditioning vector c, on activations normalised with the statistics the
port stores per truncation value (``running_means``/``running_vars``, ``n_stats`` = 51
values of truncation in [0, 1], interpolated as the port does). Spectral normalisation
(Miyato et al., 2018) divides each weight by u^T W v with the stored singular-vector
estimates ``weight_u``, ``weight_v`` (the evaluation-mode computation; no power iteration,
the prior is not trained here).

Output range: the port emits tanh images in [-1, 1] (its conv-to-RGB has ch outputs of
which the first 3 are the image; here ch x widths[-1], the port's widths end at 1);
``forward`` returns (x + 1) / 2 in [0, 1], ``decode`` the port's [-1, 1] output.
Spaces the attacks search: z (GGL, GIAS), the conditioning vector
``condition(z, classes)``, and the blocks' features for GIFD: ``stem(c)`` is the 4x4
input, ``block(k, h, c)`` applies the k-th of ``blocks`` layers (residual blocks and the
attention block), ``head(h)`` the output layers.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from gradleak.models.port_state import load_port_state

# The port's channel multipliers per resolution 4, 8, ..., resolution (BigGAN-deep Table 5).
PORT_WIDTHS = {128: (16, 16, 8, 4, 2, 1), 256: (16, 16, 8, 8, 4, 2, 1),
               512: (16, 16, 8, 8, 4, 2, 1, 1)}


class SpectralNorm(nn.Module):
    """A linear or convolution weight divided by its spectral norm estimate u^T W v, with
    the port's names ``weight_orig``, ``weight_u``, ``weight_v`` (and ``bias``)."""

    def __init__(self, shape: tuple[int, ...], bias: bool, eps: float) -> None:
        super().__init__()
        self.weight_orig = nn.Parameter(torch.randn(shape) / math.sqrt(math.prod(shape[1:])))
        self.bias = nn.Parameter(torch.zeros(shape[0])) if bias else None
        # initial singular-vector estimates: power iteration on the initial weight (a
        # checkpoint's replace them)
        matrix, u = self.weight_orig.detach().flatten(1), torch.randn(shape[0])
        for _ in range(10):
            v = F.normalize(matrix.t() @ u, dim=0, eps=eps)
            u = F.normalize(matrix @ v, dim=0, eps=eps)
        self.register_buffer("weight_u", u)
        self.register_buffer("weight_v", v)

    def weight(self) -> torch.Tensor:
        sigma = torch.dot(self.weight_u, self.weight_orig.flatten(1) @ self.weight_v)
        return self.weight_orig / sigma


class SNLinear(SpectralNorm):
    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, eps: float = 1e-4) -> None:
        super().__init__((out_dim, in_dim), bias, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight(), self.bias)


class SNConv2d(SpectralNorm):
    def __init__(self, in_ch: int, out_ch: int, kernel: int = 1, bias: bool = True,
                 eps: float = 1e-4) -> None:
        super().__init__((out_ch, in_ch, kernel, kernel), bias, eps)
        self.padding = kernel // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight(), self.bias, padding=self.padding)


class BigGANBatchNorm(nn.Module):
    """BatchNorm with stored statistics per truncation; conditional: gain 1 + scale(c),
    bias offset(c); unconditional: learned weight and bias."""

    def __init__(self, channels: int, cond_dim: int | None, n_stats: int, eps: float) -> None:
        super().__init__()
        self.register_buffer("running_means", torch.zeros(n_stats, channels))
        self.register_buffer("running_vars", torch.ones(n_stats, channels))
        self.step_size, self.eps = 1.0 / (n_stats - 1), eps
        self.conditional = cond_dim is not None
        if self.conditional:
            self.scale = SNLinear(cond_dim, channels, bias=False, eps=eps)
            self.offset = SNLinear(cond_dim, channels, bias=False, eps=eps)
        else:
            self.weight = nn.Parameter(torch.ones(channels))
            self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, truncation: float,
                cond: torch.Tensor | None = None) -> torch.Tensor:
        coef, start = math.modf(truncation / self.step_size)
        start = int(start)
        mean, var = self.running_means[start], self.running_vars[start]
        if coef != 0.0:  # the port's interpolation between neighbouring stored statistics
            mean = mean * coef + self.running_means[start + 1] * (1 - coef)
            var = var * coef + self.running_vars[start + 1] * (1 - coef)
        if not self.conditional:
            return F.batch_norm(x, mean, var, self.weight, self.bias, training=False,
                                eps=self.eps)
        gain = (1 + self.scale(cond))[:, :, None, None]
        bias = self.offset(cond)[:, :, None, None]
        return (x - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None]
                                                            + self.eps) * gain + bias


class SelfAttn(nn.Module):
    """SAGAN's self-attention: theta/phi/g 1x1 convolutions (phi, g max-pooled 2x2), a
    softmax over positions, a 1x1 output convolution added with the learned gain gamma."""

    def __init__(self, channels: int, eps: float) -> None:
        super().__init__()
        self.snconv1x1_theta = SNConv2d(channels, channels // 8, bias=False, eps=eps)
        self.snconv1x1_phi = SNConv2d(channels, channels // 8, bias=False, eps=eps)
        self.snconv1x1_g = SNConv2d(channels, channels // 2, bias=False, eps=eps)
        self.snconv1x1_o_conv = SNConv2d(channels // 2, channels, bias=False, eps=eps)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, ch, h, w = x.shape
        theta = self.snconv1x1_theta(x).view(b, ch // 8, h * w)
        phi = F.max_pool2d(self.snconv1x1_phi(x), 2).view(b, ch // 8, h * w // 4)
        attn = torch.softmax(torch.bmm(theta.transpose(1, 2), phi), dim=-1)
        g = F.max_pool2d(self.snconv1x1_g(x), 2).view(b, ch // 2, h * w // 4)
        out = torch.bmm(g, attn.transpose(1, 2)).view(b, ch // 2, h, w)
        return x + self.gamma * self.snconv1x1_o_conv(out)


class GenBlock(nn.Module):
    """BigGAN-deep's residual bottleneck block (App. B, Fig. 16)."""

    def __init__(self, in_ch: int, out_ch: int, cond_dim: int, up: bool, n_stats: int,
                 eps: float, reduction: int = 4) -> None:
        super().__init__()
        mid = in_ch // reduction
        self.up, self.drop_channels = up, in_ch != out_ch
        self.bn_0 = BigGANBatchNorm(in_ch, cond_dim, n_stats, eps)
        self.conv_0 = SNConv2d(in_ch, mid, 1, eps=eps)
        self.bn_1 = BigGANBatchNorm(mid, cond_dim, n_stats, eps)
        self.conv_1 = SNConv2d(mid, mid, 3, eps=eps)
        self.bn_2 = BigGANBatchNorm(mid, cond_dim, n_stats, eps)
        self.conv_2 = SNConv2d(mid, mid, 3, eps=eps)
        self.bn_3 = BigGANBatchNorm(mid, cond_dim, n_stats, eps)
        self.conv_3 = SNConv2d(mid, out_ch, 1, eps=eps)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, truncation: float) -> torch.Tensor:
        h = self.conv_0(F.relu(self.bn_0(x, truncation, cond)))
        h = F.relu(self.bn_1(h, truncation, cond))
        if self.up:
            h = F.interpolate(h, scale_factor=2, mode="nearest")
        h = self.conv_1(h)
        h = self.conv_2(F.relu(self.bn_2(h, truncation, cond)))
        h = self.conv_3(F.relu(self.bn_3(h, truncation, cond)))
        if self.drop_channels:
            x = x[:, :x.shape[1] // 2]
        if self.up:
            x = F.interpolate(x, scale_factor=2, mode="nearest")
        return h + x


class Generator(nn.Module):
    """The port's ``generator`` submodule: gen_z, layers, bn, conv_to_rgb."""

    def __init__(self, layers: list[tuple[bool, int, int]], ch: int, cond_dim: int,
                 attention_position: int, n_stats: int, eps: float) -> None:
        super().__init__()
        self.ch, self.stem_channels = ch, ch * layers[0][1]
        final = ch * layers[-1][2]
        self.gen_z = SNLinear(cond_dim, 4 * 4 * self.stem_channels, eps=eps)
        modules: list[nn.Module] = []
        for i, (up, m_in, m_out) in enumerate(layers):
            if i == attention_position:
                modules.append(SelfAttn(ch * m_in, eps))
            modules.append(GenBlock(ch * m_in, ch * m_out, cond_dim, up, n_stats, eps))
        self.layers = nn.ModuleList(modules)
        self.bn = BigGANBatchNorm(final, None, n_stats, eps)
        self.conv_to_rgb = SNConv2d(final, final, 3, eps=eps)


class BigGANGenerator(nn.Module):
    """See the module docstring. ``resolution`` 4 * 2^n; ``widths`` the channel multipliers
    of ``channel_width`` at 4, 8, ..., ``resolution`` (default: the port's for 128, 256,
    512); ``latent_dim`` the size of z and of the class embedding (128); ``truncation`` in
    (0, 1] picks the stored BatchNorm statistics (1: the untruncated prior N(0, I))."""

    def __init__(self, resolution: int, latent_dim: int = 128, channel_width: int = 128,
                 num_classes: int = 1000, widths: tuple[int, ...] | None = None,
                 attention_resolution: int = 64, n_stats: int = 51, eps: float = 1e-4,
                 truncation: float = 1.0) -> None:
        super().__init__()
        steps = int(math.log2(resolution / 4)) if resolution >= 8 else 0
        if steps < 1 or 4 * 2 ** steps != resolution:
            raise ValueError(f"BigGAN resolution must be 4 times a power of 2, at least 8; "
                             f"got {resolution!r}")
        widths = PORT_WIDTHS.get(resolution) if widths is None else tuple(widths)
        if widths is None or len(widths) != steps + 1 or not all(
                isinstance(w, int) and w > 0 for w in widths) or any(
                a != b and a != 2 * b for a, b in zip(widths, widths[1:])):
            raise ValueError(f"BigGAN widths must be {steps + 1} positive multipliers, one per "
                             f"resolution 4..{resolution}, each equal to or half the one "
                             f"before (the residual skip drops half the channels); got "
                             f"{widths!r}")
        if not 0 < truncation <= 1:
            raise ValueError(f"BigGAN truncation must be in (0, 1]; got {truncation!r}")
        layers = [layer for a, b in zip(widths, widths[1:])
                  for layer in ((False, a, a), (True, a, b))]
        attention = 2 * int(math.log2(attention_resolution / 4)) if attention_resolution >= 4 \
            else -1
        if not 0 <= attention < len(layers) or 4 * 2 ** (attention // 2) != attention_resolution:
            raise ValueError(f"BigGAN attention_resolution must be one of "
                             f"{[4 * 2 ** i for i in range(steps)]}; got "
                             f"{attention_resolution!r}")
        if channel_width * min(widths) < 4 or channel_width * widths[attention // 2] < 8:
            raise ValueError(f"BigGAN channel_width x widths must give at least 4 channels per "
                             f"block (the bottleneck has a quarter, the output 3) and 8 at the "
                             f"attention resolution; got channel_width {channel_width!r}, "
                             f"widths {widths!r}")
        self.resolution, self.latent_dim, self.num_classes = resolution, latent_dim, num_classes
        self.widths, self.truncation = widths, float(truncation)
        self.embeddings = nn.Linear(num_classes, latent_dim, bias=False)
        self.generator = Generator(layers, channel_width, 2 * latent_dim, attention, n_stats,
                                   eps)
        self.blocks = len(self.generator.layers)

    def condition(self, z: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """[z, embed(class)]: ``classes`` integer labels (B,) or class vectors (B,
        num_classes) (one-hot, or soft as GGL's label search may give)."""
        if classes.dim() == 1:
            classes = F.one_hot(classes.long(), self.num_classes).to(z.dtype)
        return torch.cat([z, self.embeddings(classes)], dim=1)

    def stem(self, cond: torch.Tensor) -> torch.Tensor:
        """The 4x4 input (B, widths[0] ch, 4, 4; the port's 16 ch), from the port's TF
        layout (B, 4, 4, C) permuted."""
        h = self.generator.gen_z(cond)
        return h.view(-1, 4, 4, self.generator.stem_channels).permute(0, 3, 1, 2).contiguous()

    def block(self, k: int, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        layer = self.generator.layers[k]
        return layer(h, cond, self.truncation) if isinstance(layer, GenBlock) else layer(h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The output layers: BatchNorm, ReLU, conv to RGB (first 3 channels), tanh."""
        g = self.generator
        return torch.tanh(g.conv_to_rgb(F.relu(g.bn(h, self.truncation)))[:, :3])

    def decode(self, z: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """The port's output in [-1, 1]."""
        cond = self.condition(z, classes)
        h = self.stem(cond)
        for k in range(self.blocks):
            h = self.block(k, h, cond)
        return self.head(h)

    def forward(self, z: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """z (B, latent) and classes -> images (B, 3, resolution, resolution) in [0, 1]."""
        return (self.decode(z, classes) + 1) / 2


def load_biggan(path: str | os.PathLike, resolution: int, check_only: bool = False,
                **architecture) -> BigGANGenerator:
    """The generator in ``path``: huggingface/pytorch-pretrained-BigGAN's
    ``pytorch_model.bin`` (a state dict), read with ``weights_only=True``; eval mode.
    ``architecture``: ``BigGANGenerator``'s other arguments (the port's ``config.json``:
    z_dim -> latent_dim, channel_width, num_classes). ``check_only``: the file's keys and
    shapes checked against a net on the meta device, no tensor data read
    (``load_port_state``)."""
    with torch.device("meta") if check_only else contextlib.nullcontext():
        net = BigGANGenerator(resolution, **architecture)
    what = (f"the BigGAN-deep generator (huggingface/pytorch-pretrained-BigGAN layout, "
            f"resolution {resolution}, latent {net.latent_dim}, widths {net.widths} x "
            f"{net.generator.ch}, {net.num_classes} classes)")
    return load_port_state(net, path, what, check_only=check_only)
