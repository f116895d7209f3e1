"""The layers :class:`~gradleak.attacks.stacked_gradients.StackedModel` runs P stacked
problems through: a model's Conv2d and Linear layers with their shared weight and bias,
recording each layer's input and output on a :class:`Tape`, and BatchNorm per problem (its
own batch statistics, its own copy of the scale and shift). Convolutions go through
:class:`InputGradientConv`, whose backward is a differentiable transposed convolution:
PyTorch's own convolution double backward also computes the weight's gradient, unused here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Moments = tuple[torch.Tensor, torch.Tensor]


class InputGradientConv(torch.autograd.Function):
    """``conv2d(x, weight)`` for a constant ``weight``; its backward, the input's gradient,
    is a transposed convolution that autograd differentiates again as one convolution."""

    @staticmethod
    def forward(ctx, x, weight, stride, padding, dilation):
        ctx.save_for_backward(weight)
        ctx.geometry = (stride, padding, dilation, x.shape[2:])
        return F.conv2d(x, weight, None, stride, padding, dilation)

    @staticmethod
    def backward(ctx, grad_output):
        (weight,) = ctx.saved_tensors
        stride, padding, dilation, size = ctx.geometry
        output_padding = [size[i] - ((grad_output.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
                                     + dilation[i] * (weight.shape[2 + i] - 1) + 1)
                          for i in range(2)]
        grad_input = F.conv_transpose2d(grad_output, weight, None, stride, padding,
                                        output_padding, 1, dilation)
        return grad_input, None, None, None, None


@dataclass
class Layer:
    """One weight layer's forward on the stacked batch: its input and its output before
    the bias; ``conv`` is the Conv2d (None for a Linear layer); ``bias`` its bias's name."""

    weight: str
    inputs: torch.Tensor
    outputs: torch.Tensor
    conv: nn.Conv2d | None
    bias: str | None


class Tape:
    """What the stacked layers share during one forward: the problem count, the
    per-problem copies of BatchNorm's scale and shift, the weight layers in call order and each
    BatchNorm layer's stacked input (with its moments where BatchNorm computed them)."""

    def __init__(self) -> None:
        self.problems = 1
        self.copies: dict[str, torch.Tensor] = {}
        self.layers: list[Layer] = []
        self.norm_inputs: dict[nn.Module, tuple[torch.Tensor, Moments | None]] = {}

    def per_problem(self, name: str, ndim: int) -> torch.Tensor:
        """The copy of parameter ``name`` (P, C) shaped to broadcast over (P, B, C, ...)."""
        copies = self.copies[name]
        return copies.view(self.problems, 1, copies.shape[1], *(1,) * (ndim - 2))


class StackedWeight(nn.Module):
    """A Conv2d or Linear layer with its shared weight, recorded on the tape."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, prefix: str, tape: Tape) -> None:
        super().__init__()
        self.layer, self.prefix, self.tape = layer, prefix, tape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer, weight = self.layer, self.layer.weight.detach()
        conv = layer if isinstance(layer, nn.Conv2d) else None
        z = (x @ weight.T if conv is None else InputGradientConv.apply(
            x, weight, layer.stride, layer.padding, layer.dilation))
        bias = None if layer.bias is None else self.prefix + "bias"
        self.tape.layers.append(Layer(self.prefix + "weight", x, z, conv, bias))
        if bias is None:
            return z
        shared = layer.bias.detach()  # its per-problem gradient: the output gradient's sum
        return z + (shared if conv is None else shared.view(-1, 1, 1))


def batch_moments(stacked: torch.Tensor) -> Moments:
    """Per problem and channel, the mean and biased variance of a (P, B, C, ...) input,
    kept broadcastable (P, 1, C, 1, ...)."""
    var, mean = torch.var_mean(stacked, dim=(1, *range(3, stacked.ndim)), unbiased=False,
                               keepdim=True)
    return mean, var


class StackedBatchNorm(nn.Module):
    """BatchNorm per problem: in training mode (or without running statistics) each
    problem's own batch mean and biased variance; its own copy of scale and shift."""

    def __init__(self, layer: nn.modules.batchnorm._BatchNorm, prefix: str, tape: Tape) -> None:
        super().__init__()
        self.layer, self.prefix, self.tape = layer, prefix, tape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer, stacked = self.layer, x.unflatten(0, (self.tape.problems, -1))
        if layer.training or layer.running_mean is None:
            mean, var = moments = batch_moments(stacked)
        else:
            moments = None
            channel = (1, 1, -1, *(1,) * (stacked.ndim - 3))
            mean, var = layer.running_mean.view(channel), layer.running_var.view(channel)
        self.tape.norm_inputs[layer] = (stacked, moments)
        out = (stacked - mean) * torch.rsqrt(var + layer.eps)
        if layer.affine:
            out = (out * self.tape.per_problem(self.prefix + "weight", out.ndim - 1)
                   + self.tape.per_problem(self.prefix + "bias", out.ndim - 1))
        return out.flatten(0, 1)


def stacked_layer(module: nn.Module) -> type[nn.Module] | None:
    if isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros":
        return StackedWeight
    if isinstance(module, nn.Linear):
        return StackedWeight
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return StackedBatchNorm
    return None


def unsupported(model: nn.Module) -> list[str]:
    """The modules holding parameters that :class:`StackedModel` cannot stack (anything but
    Conv2d with one group and zero padding, Linear and BatchNorm); empty when it can."""
    return [f"{name or 'model'} ({type(module).__name__})"
            for name, module in model.named_modules()
            if stacked_layer(module) is None and list(module.parameters(recurse=False))]


def stacked_copy(module: nn.Module, tape: Tape, prefix: str = "") -> nn.Module:
    """``module`` with its weight and BatchNorm layers in their stacked forms, on ``tape``."""
    stacked = stacked_layer(module)
    if stacked is not None:
        return stacked(module, prefix, tape)
    converted = copy.copy(module)
    converted._modules = {name: stacked_copy(child, tape, f"{prefix}{name}.")
                          for name, child in module.named_children()}
    return converted
