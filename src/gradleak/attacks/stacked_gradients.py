"""The trial gradients of P gradient-matching problems at once, reduced to what the
distances need: their inner products with the targets and with themselves.

P problems (victims x restarts of one FL round) share one model. :class:`StackedModel`
runs their images as one batch through the model's own layers with the weights held
constant: convolutions and linear layers with the shared weight and bias (one oneDNN/cuDNN
call for all problems), BatchNorm with each problem's own batch statistics and its own
copy of the scale and shift. One backward pass gives, per weight layer, G: each problem's
gradient with respect to the layer's output, whose sum over the problem's batch and
positions is its bias's trial gradient. The trial gradient of the weight is G^T X, for X the
layer's unfolded input (N rows per problem: batch x output positions), and Inverting
Gradients' cosine distance (Geiping et al., NeurIPS 2020, Eq. 4) needs only

    <G^T X, T>   = sum(G * conv(x, T))         a convolution of the input by the target T
    |G^T X|^2    = sum((G G^T) * (X X^T))      two N x N Gram matrices

so where N is small (ResNet-18 on 32x32 images: N = 64 and 16 in its last two stages,
against a 512 x 4608 gradient per problem and layer) the per-problem weight gradient is
never formed; elsewhere it is: a Linear layer's as one batched matrix product, a
convolution's as one grouped convolution's weight gradient (the problems as its groups,
``torch.nn.grad.conv2d_weight``: oneDNN's kernel, without unfolding the input; 1.2-2.7x the
unfolded product with its backward on LeNet's and ResNet-18's layers, docs/measurements.md).
The L2 distances (DLG Eq. 4, GGL) sum (G^T X - T)^2 from the formed gradient, exact near
convergence.

Differentiating these products with respect to the images (autograd) is the exact second
derivative the per-victim loop computes (the layers: ``stacked_layers``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gradleak.attacks.bn_statistics import batchnorm_layers
from gradleak.attacks.objectives import GradientProducts
from gradleak.attacks.stacked_layers import (
    Layer,
    Moments,
    StackedWeight,
    Tape,
    batch_moments,
    stacked_copy,
    unsupported,
)

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


def forming_pays(model: nn.Module) -> bool:
    """Whether problems whose trial gradients are formed stack faster than they loop:
    ``model`` has at most :data:`FORMED_PARAMETERS` parameters."""
    return sum(p.numel() for p in model.parameters()) <= FORMED_PARAMETERS


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
        self.tape = Tape()
        self.stacked = stacked_copy(model, self.tape)
        weights = {layer.prefix + name for layer in self.stacked.modules()
                   if isinstance(layer, StackedWeight) for name in ("weight", "bias")}
        self.copied = [n for n in self.parameters if n not in weights]
        self._target_cache: tuple = (None, None, None, None)

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
            mean, var = batch_moments(stacked) if moments is None else moments
            stats.append((mean.flatten(1), var.flatten(1)))
        return stats

    @staticmethod
    def _factors(layer: Layer, g: torch.Tensor, problems: int
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

    @staticmethod
    def _formed(layer: Layer, g: torch.Tensor, problems: int) -> torch.Tensor:
        """(P, C, K): each problem's trial gradient of the layer's weight, flattened. A
        convolution's is the weight gradient of one convolution with the problems as its
        groups (input (B, P x C_in, H, W), output gradient (B, P x C, H', W'))."""
        if layer.conv is None:
            columns, outputs = StackedModel._factors(layer, g, problems)
            return outputs @ columns.transpose(1, 2)
        conv, weight = layer.conv, layer.conv.weight

        def grouped(t: torch.Tensor) -> torch.Tensor:
            t = t.unflatten(0, (problems, -1))
            return t.transpose(0, 1).flatten(1, 2)

        formed = torch.nn.grad.conv2d_weight(
            grouped(layer.inputs), (problems * weight.shape[0], *weight.shape[1:]),
            grouped(g), conv.stride, conv.padding, conv.dilation, problems)
        return formed.view(problems, weight.shape[0], -1)

    @staticmethod
    def _bias(layer: Layer, g: torch.Tensor, problems: int) -> torch.Tensor:
        """(P, C): each problem's trial gradient of the layer's bias, its output gradient
        summed over its batch and positions."""
        rows = g.unflatten(0, (problems, -1))
        return rows.sum((1, 3, 4)) if layer.conv is not None else \
            rows.flatten(1, -2).sum(1)

    @staticmethod
    def _sizes(layer: Layer, problems: int) -> tuple[int, int, int]:
        """A weight layer's (C, K, N): output channels, inputs per output (its weight's
        row) and rows per problem (batch x output positions)."""
        weight = layer.conv.weight if layer.conv is not None else None
        if weight is None:
            outputs = _positions(layer.outputs)
            return outputs.shape[2], layer.inputs.shape[-1], len(outputs) * outputs.shape[1] \
                // problems
        return weight.shape[0], weight[0].numel(), layer.outputs[:, 0].numel() // problems

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
                shape = self.parameters[layer.weight].shape
                formed[layer.weight] = self._formed(layer, g, problems).view(problems, *shape)
                if layer.bias is not None:
                    formed[layer.bias] = self._bias(layer, g, problems)
        formed.update(zip(self.tape.copies, copied))
        return {name: formed[name] for name in self.parameters}

    def products(self, images: torch.Tensor, labels: torch.Tensor,
                 targets: dict[str, torch.Tensor], residual: bool) -> GradientProducts:
        """Products of the trial gradients of ``images`` (V * R, B, ...), victim-major,
        with ``targets`` (name -> (V, *shape)); each problem's loss is the mean
        cross-entropy of its batch against ``labels`` (V * R, B). ``residual``: also
        sum (trial - target)^2, from formed gradients."""
        problems = len(images)
        victims = len(next(iter(targets.values())))
        restarts = problems // victims
        output_grads, copied = self._output_gradients(images, labels, torch.is_grad_enabled())

        dot = trial_sq = residual_sq = images.new_zeros(problems)
        parts, names = [], []  # the formed trial gradients (P, n) and their parameters
        for layer, g in zip(self.tape.layers, output_grads):
            channels, inputs, rows = self._sizes(layer, problems)
            if not residual and rows * (channels + inputs) < channels * inputs:
                columns, outputs = self._factors(layer, g, problems)
                trial_sq = trial_sq + ((outputs.transpose(1, 2) @ outputs)
                                       * (columns.transpose(1, 2) @ columns)).sum((1, 2))
                dot = dot + self._target_dot(layer, g, targets[layer.weight], restarts)
            else:
                parts.append(self._formed(layer, g, problems).flatten(1))
                names.append(layer.weight)
            if layer.bias is not None:
                parts.append(self._bias(layer, g, problems))
                names.append(layer.bias)
        parts += copied
        names += list(self.tape.copies)
        if parts:  # one product of all of them with their targets, (V, R, n) x (V, n)
            trial = torch.cat(parts, 1).unflatten(0, (victims, restarts))
            expected = self._targets(targets, names)[1]
            if residual:
                residual_sq = residual_sq + ((trial - expected.unsqueeze(1)) ** 2).sum(2).flatten()
            else:
                dot = dot + (trial @ expected.unsqueeze(2)).flatten()
                trial_sq = trial_sq + (trial * trial).sum(2).flatten()
        return GradientProducts(dot=dot, trial_sq=trial_sq, residual_sq=residual_sq,
                                target_sq=self._targets(targets, names)[0].repeat_interleave(
                                    restarts), layers=len(targets))

    def _targets(self, targets: dict[str, torch.Tensor], names: list[str]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The targets' squared norms (V,) and the targets ``names`` side by side (V, n),
        made once per ``targets`` object and ``names``."""
        if self._target_cache[0] is not targets or self._target_cache[1] != names:
            norms = sum(torch.stack([torch.dot(row, row) for row in t.flatten(1)])
                        for t in targets.values())  # one BLAS dot a row, no temporary
            joined = torch.cat([targets[n].flatten(1) for n in names], 1) if names else None
            self._target_cache = (targets, names, norms, joined)
        return self._target_cache[2], self._target_cache[3]

    @staticmethod
    def _target_dot(layer: Layer, g: torch.Tensor, target: torch.Tensor,
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
