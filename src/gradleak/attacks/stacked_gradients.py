"""The trial gradients of P gradient-matching problems at once, reduced to what the
distances need: their inner products with the targets and with themselves.

P problems (victims x restarts of one FL round) share one model. :class:`StackedModel`
runs their images as one batch through the model's own layers with the weights held
constant: convolutions and linear layers with the shared weight (one oneDNN/cuDNN call
for all problems), BatchNorm with each problem's own batch statistics, and every
parameter that is not a weight matrix (biases, BatchNorm's scale and shift) as a
per-problem copy. One backward pass gives, per weight layer, G: each problem's gradient
with respect to the layer's output. The trial gradient of the weight is G^T X, for X the
layer's unfolded input (N rows per problem: batch x output positions), and Inverting
Gradients' cosine distance (Geiping et al., NeurIPS 2020, Eq. 4) needs only

    <G^T X, T>   = sum(G * conv(x, T))         a convolution of the input by the target T
    |G^T X|^2    = sum((G G^T) * (X X^T))      two N x N Gram matrices

so where N is small (ResNet-18 on 32x32 images: N = 64 and 16 in its last two stages,
against a 512 x 4608 gradient per problem and layer) the per-problem weight gradient is
never formed; elsewhere it is, as one batched matrix product. The L2 distances (DLG Eq. 4,
GGL) sum (G^T X - T)^2 from the formed gradient, exact near convergence.

Differentiating these products with respect to the images (autograd) is the exact second
derivative the per-victim loop computes. Convolutions go through
:class:`InputGradientConv`, whose backward is a differentiable transposed convolution:
PyTorch's own convolution double backward also computes the weight's gradient, unused here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gradleak.attacks.bn_statistics import batchnorm_layers
from gradleak.attacks.objectives import GradientProducts

# glibc's default ceiling on its mmap threshold: a larger tensor is mapped afresh and
# page-faulted on every step (measured: ResNet-18 at 16 stacked problems ran 0.8x the
# rate per problem of 8, whose unfolded first-stage inputs stay below it).
STEP_TENSOR_BYTES = 32 * 2**20

# The largest model (parameters) whose trial gradients, formed per problem (the L2
# distances, the adaptive transformations, CMA-ES), stack faster than they loop. Measured
# on 2 CPU threads, 3x32x32 images: a CMA-ES round of 50 candidates
# (benchmarks/cmaes_population.py) stacked ran 3.8x the loop on LeNet, 1.3x on ResNet-10 of
# width 16 (0.3M parameters), 1.1x at width 32 (1.2M), 0.84x at width 64 (4.9M), 0.78x on
# ResNet-18 (11M); GGA's Adam (2 victims x 4 restarts) 1.6x at width 32, 1.06x at width 64,
# 0.90x on ResNet-18.
FORMED_PARAMETERS = 2_000_000


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
class _Layer:
    """One weight layer's forward on the stacked batch: its input and its output before
    the bias; ``conv`` is the Conv2d (None for a Linear layer)."""

    weight: str
    inputs: torch.Tensor
    outputs: torch.Tensor
    conv: nn.Conv2d | None


class _Tape:
    """What the stacked layers share during one forward: the problem count, the
    per-problem copies of the small parameters, the weight layers in call order and each
    BatchNorm layer's stacked input (with its moments where BatchNorm computed them)."""

    def __init__(self) -> None:
        self.problems = 1
        self.copies: dict[str, torch.Tensor] = {}
        self.layers: list[_Layer] = []
        self.norm_inputs: dict[nn.Module, tuple[torch.Tensor, Moments | None]] = {}

    def per_problem(self, name: str, ndim: int) -> torch.Tensor:
        """The copy of parameter ``name`` (P, C) shaped to broadcast over (P, B, C, ...)."""
        copies = self.copies[name]
        return copies.view(self.problems, 1, copies.shape[1], *(1,) * (ndim - 2))

    def add_bias(self, z: torch.Tensor, name: str | None) -> torch.Tensor:
        if name is None:
            return z
        return (z.unflatten(0, (self.problems, -1)) + self.per_problem(name, z.ndim)).flatten(0, 1)


class _StackedWeight(nn.Module):
    """A Conv2d or Linear layer with its shared weight, recorded on the tape."""

    def __init__(self, layer: nn.Conv2d | nn.Linear, prefix: str, tape: _Tape) -> None:
        super().__init__()
        self.layer, self.prefix, self.tape = layer, prefix, tape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer, weight = self.layer, self.layer.weight.detach()
        conv = layer if isinstance(layer, nn.Conv2d) else None
        z = (x @ weight.T if conv is None else InputGradientConv.apply(
            x, weight, layer.stride, layer.padding, layer.dilation))
        self.tape.layers.append(_Layer(self.prefix + "weight", x, z, conv))
        return self.tape.add_bias(z, None if layer.bias is None else self.prefix + "bias")


Moments = tuple[torch.Tensor, torch.Tensor]


def _moments(stacked: torch.Tensor) -> Moments:
    """Per problem and channel, the mean and biased variance of a (P, B, C, ...) input,
    kept broadcastable (P, 1, C, 1, ...)."""
    var, mean = torch.var_mean(stacked, dim=(1, *range(3, stacked.ndim)), unbiased=False,
                               keepdim=True)
    return mean, var


class _StackedBatchNorm(nn.Module):
    """BatchNorm per problem: in training mode (or without running statistics) each
    problem's own batch mean and biased variance; its own copy of scale and shift."""

    def __init__(self, layer: nn.modules.batchnorm._BatchNorm, prefix: str, tape: _Tape) -> None:
        super().__init__()
        self.layer, self.prefix, self.tape = layer, prefix, tape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer, stacked = self.layer, x.unflatten(0, (self.tape.problems, -1))
        if layer.training or layer.running_mean is None:
            mean, var = moments = _moments(stacked)
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


def _stacked_layer(module: nn.Module) -> type[nn.Module] | None:
    if isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros":
        return _StackedWeight
    if isinstance(module, nn.Linear):
        return _StackedWeight
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return _StackedBatchNorm
    return None


def unsupported(model: nn.Module) -> list[str]:
    """The modules holding parameters that :class:`StackedModel` cannot stack (anything but
    Conv2d with one group and zero padding, Linear and BatchNorm); empty when it can."""
    return [f"{name or 'model'} ({type(module).__name__})"
            for name, module in model.named_modules()
            if _stacked_layer(module) is None and list(module.parameters(recurse=False))]


def forming_pays(model: nn.Module) -> bool:
    """Whether problems whose trial gradients are formed stack faster than they loop:
    ``model`` has at most :data:`FORMED_PARAMETERS` parameters."""
    return sum(p.numel() for p in model.parameters()) <= FORMED_PARAMETERS


def _converted(module: nn.Module, tape: _Tape, prefix: str = "") -> nn.Module:
    stacked = _stacked_layer(module)
    if stacked is not None:
        return stacked(module, prefix, tape)
    converted = copy.copy(module)
    converted._modules = {name: _converted(child, tape, f"{prefix}{name}.")
                          for name, child in module.named_children()}
    return converted


def _positions(t: torch.Tensor) -> torch.Tensor:
    """A Linear layer's (P * B, ..., F) input or output as (P * B, positions, F)."""
    return t.reshape(len(t), -1, t.shape[-1])


def _rows(t: torch.Tensor, problems: int) -> torch.Tensor:
    """(P * B, C, L) -> (P, C, B * L): per problem, one column per batch item and position."""
    t = t.unflatten(0, (problems, -1))
    return t.squeeze(1) if t.shape[1] == 1 else t.transpose(1, 2).flatten(2)


class StackedModel:
    """``model`` run on P stacked problems; :meth:`products` gives their trial gradients'
    :class:`~gradleak.attacks.objectives.GradientProducts` with the targets, differentiable
    with respect to the images. ``model``'s parameters and running statistics are read,
    never written."""

    def __init__(self, model: nn.Module) -> None:
        missing = unsupported(model)
        if missing:
            raise ValueError(f"cannot stack problems through {', '.join(missing)}: expected "
                             "parameters only in Conv2d (groups=1, zero padding), Linear and "
                             "BatchNorm layers")
        self.model, self.parameters = model, dict(model.named_parameters())
        self.tape = _Tape()
        self.stacked = _converted(model, self.tape)
        weights = {layer.prefix + "weight" for layer in self.stacked.modules()
                   if isinstance(layer, _StackedWeight)}
        self.copied = [n for n in self.parameters if n not in weights]
        self._target_sq: tuple[object, torch.Tensor] = (None, torch.empty(0))

    def _forward(self, images: torch.Tensor, problems: int) -> torch.Tensor:
        self.tape.problems, self.tape.layers, self.tape.norm_inputs = problems, [], {}
        self.tape.copies = {n: p.detach().expand(problems, *p.shape).requires_grad_()
                            for n, p in self.parameters.items() if n in self.copied}
        return self.stacked(images.flatten(0, 1))

    def problems_per_step(self, batch: torch.Tensor) -> int:
        """How many problems of ``batch`` (B, ...) one step stacks: as many as keep its
        largest tensor (a layer's unfolded input, input or output) within
        :data:`STEP_TENSOR_BYTES`, at least one."""
        with torch.no_grad():
            self._forward(batch.unsqueeze(0), 1)
        sizes = []
        for layer in self.tape.layers:
            sizes += [layer.inputs.numel(), layer.outputs.numel()]
            if layer.conv is not None:
                kernel = layer.conv.weight[0].numel()
                sizes.append(kernel * layer.outputs[0, 0].numel() * len(layer.outputs))
        return max(1, STEP_TENSOR_BYTES // (max(sizes) * batch.element_size()))

    def _output_gradients(self, images: torch.Tensor, labels: torch.Tensor,
                          create_graph: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Run ``images`` (P, B, ...); each problem's loss is the mean cross-entropy of its
        batch against ``labels``: (P, B) classes or (P, B, classes) probabilities (DLG's
        soft labels, differentiable). Returns the gradients of the weight layers'
        outputs (tape order) and of the per-problem copies (``tape.copies`` order)."""
        problems = len(images)
        if not images.requires_grad:  # the layer outputs need a graph even without copies
            images = images.detach().requires_grad_()
        with torch.enable_grad():
            logits = self._forward(images, problems)
            losses = F.cross_entropy(logits, labels.flatten(0, 1), reduction="none")
            layers = self.tape.layers
            grads = torch.autograd.grad(losses.view(problems, -1).mean(1).sum(),
                                        [layer.outputs for layer in layers]
                                        + list(self.tape.copies.values()),
                                        create_graph=create_graph)
        return list(grads[:len(layers)]), list(grads[len(layers):])

    def batchnorm_statistics(self) -> list[Moments]:
        """Per BatchNorm layer of the model (``model.modules()`` order, as
        :class:`~gradleak.attacks.bn_statistics.BNRecorder`), the (P, C) per-problem mean and
        biased variance of its input in the last forward: GradInversion's R_BN, stacked."""
        stats = []
        for layer in batchnorm_layers(self.model):
            if layer not in self.tape.norm_inputs:
                raise RuntimeError(f"BatchNorm layer {layer} did not run in the last forward")
            stacked, moments = self.tape.norm_inputs[layer]
            mean, var = _moments(stacked) if moments is None else moments
            stats.append((mean.flatten(1), var.flatten(1)))
        return stats

    @staticmethod
    def _factors(layer: _Layer, g: torch.Tensor, problems: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(P, K, N) unfolded inputs and (P, C, N) output gradients of a weight layer, whose
        trial gradient is their product (P, C, K)."""
        if layer.conv is None:
            return (_rows(_positions(layer.inputs).transpose(1, 2), problems),
                    _rows(_positions(g).transpose(1, 2), problems))
        conv = layer.conv
        return (_rows(F.unfold(layer.inputs, conv.kernel_size, conv.dilation, conv.padding,
                               conv.stride), problems),
                _rows(g.flatten(2), problems))

    def gradients(self, images: torch.Tensor, labels: torch.Tensor,
                  create_graph: bool = False) -> dict[str, torch.Tensor]:
        """The trial gradients of P problems, formed: parameter name -> (P, *shape), for
        ``images`` (P, B, ...) and ``labels`` (P, B) (each problem's loss the mean
        cross-entropy of its batch); differentiable in the images when ``create_graph``."""
        problems = len(images)
        output_grads, copied = self._output_gradients(images, labels, create_graph)
        formed = {}
        with torch.set_grad_enabled(create_graph):
            for layer, g in zip(self.tape.layers, output_grads):
                columns, outputs = self._factors(layer, g, problems)
                shape = self.parameters[layer.weight].shape
                formed[layer.weight] = (outputs @ columns.transpose(1, 2)).view(problems, *shape)
        formed.update(zip(self.tape.copies, copied))
        return {name: formed[name] for name in self.parameters}

    def products(self, images: torch.Tensor, labels: torch.Tensor,
                 targets: dict[str, torch.Tensor], residual: bool) -> GradientProducts:
        """Products of the trial gradients of ``images`` (V * R, B, ...), victim-major,
        with ``targets`` (name -> (V, *shape)); each problem's loss is the mean
        cross-entropy of its batch against ``labels`` (V * R, B). ``residual``: also
        sum (trial - target)^2, from formed gradients. The targets' squared norms are
        computed once per ``targets`` object."""
        problems = len(images)
        victims = len(next(iter(targets.values())))
        restarts = problems // victims
        output_grads, copied = self._output_gradients(images, labels, torch.is_grad_enabled())

        def by_victim(t: torch.Tensor) -> torch.Tensor:
            return t.unflatten(0, (victims, restarts))

        dot = trial_sq = residual_sq = images.new_zeros(problems)

        def add(trial: torch.Tensor, expected: torch.Tensor) -> None:
            """Add a formed trial gradient (V, R, ...) against its target (V, 1, ...)."""
            nonlocal dot, trial_sq, residual_sq
            dims = tuple(range(2, trial.ndim))
            if residual:
                residual_sq = residual_sq + ((trial - expected) ** 2).sum(dims).flatten()
            else:
                dot = dot + (trial * expected).sum(dims).flatten()
                trial_sq = trial_sq + (trial * trial).sum(dims).flatten()

        for layer, g in zip(self.tape.layers, output_grads):
            target = targets[layer.weight]
            columns, outputs = self._factors(layer, g, problems)
            (channels, rows), inputs = outputs.shape[1:], columns.shape[1]
            if not residual and rows * (channels + inputs) < channels * inputs:
                trial_sq = trial_sq + ((outputs.transpose(1, 2) @ outputs)
                                       * (columns.transpose(1, 2) @ columns)).sum((1, 2))
                dot = dot + self._target_dot(layer, g, target, restarts)
            else:  # the formed gradient^T (V, R, K, C)
                add(by_victim(columns @ outputs.transpose(1, 2)),
                    target.flatten(2).transpose(1, 2).unsqueeze(1))
        for name, g in zip(self.tape.copies, copied):
            add(by_victim(g), targets[name].flatten(1).unsqueeze(1))
        if self._target_sq[0] is not targets:
            norms = sum(torch.stack([torch.dot(row, row) for row in t.flatten(1)])
                        for t in targets.values())  # one BLAS dot a row, no temporary
            self._target_sq = (targets, norms.repeat_interleave(restarts))
        return GradientProducts(dot=dot, trial_sq=trial_sq, residual_sq=residual_sq,
                                target_sq=self._target_sq[1], layers=len(targets))

    @staticmethod
    def _target_dot(layer: _Layer, g: torch.Tensor, target: torch.Tensor,
                    restarts: int) -> torch.Tensor:
        """(P,) <G^T X, T> = sum(G * (x convolved with T)), one call per victim."""
        dots = []
        for v, kernel in enumerate(target):
            rows = slice(v * len(g) // len(target), (v + 1) * len(g) // len(target))
            if layer.conv is None:
                response = layer.inputs[rows] @ kernel.T
            else:
                conv = layer.conv
                response = F.conv2d(layer.inputs[rows], kernel, None, conv.stride, conv.padding,
                                    conv.dilation)
            dots.append((g[rows] * response).reshape(restarts, -1).sum(1))
        return torch.cat(dots)
