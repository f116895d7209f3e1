"""Layer-wise reconstruction error (GIAS App. C, Figs. A1 and A2): how far an attack's
recovered input of every layer is from the true one.

An attack that recovers every layer's input (R-GAP's recursion) hands them over input
layer first, one per Conv2d or Linear layer in the order the forward pass reaches them;
:func:`layer_errors` compares them with the inputs the true batch gives those layers.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

LAYERS = (nn.Conv2d, nn.Linear)


def layer_inputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The input of every Conv2d and Linear layer of ``model`` on ``x``, in the order the
    forward pass reaches them (the input layer first), float64 on the CPU. ``model`` is
    left as it is (a float64 CPU copy runs the forward pass, in the model's mode)."""
    twin = copy.deepcopy(model).cpu().double()
    seen: list[torch.Tensor] = []
    hooks = [m.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
             for m in twin.modules() if isinstance(m, LAYERS)]
    try:
        with torch.no_grad():
            twin(x.detach().cpu().double())
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def layer_errors(model: nn.Module, x_true: torch.Tensor, inputs: list[torch.Tensor]
                 ) -> list[float]:
    """|x_r - x_r*| / |x_r*| of every layer's recovered input ``inputs[r]`` (any shape of
    the true input's size) against the true one of the batch ``x_true`` (B, C, H, W),
    input layer first (GIAS Fig. A2); ValueError when the counts differ."""
    true = layer_inputs(model, x_true)
    if len(inputs) != len(true):
        raise ValueError(f"{len(inputs)} recovered layer inputs for the {len(true)} Conv2d "
                         f"and Linear layers of {type(model).__name__}; expected one per layer")
    return [float((r.detach().cpu().double().reshape(t.shape) - t).norm() / t.norm())
            for r, t in zip(inputs, true, strict=True)]
