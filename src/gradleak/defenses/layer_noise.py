"""Uniform noise on the gradient of one layer (Refiner §3.2.3, Insight 2, Table 2).

Refiner motivates its layer-wise weight by adding "uniform random noises into the
gradients of different layers individually" (LeNet, CIFAR-10, the setup of Table 1) at
noise magnitudes 1e-3, 1e-2 and 1e-1: early layers lose the most accuracy. The paper does
not define the magnitude further; here it is the half-width ``magnitude`` = a of
U(-a, a), drawn i.i.d. per element of the chosen layer's gradients (weight and bias)
from the context's generator. Every other layer's gradient is uploaded unchanged.

``layer`` picks the layer: an integer counts the model's layers with parameters from the
input (1 the first; -1 the last, Python's way), where a layer is the parameters sharing a
name prefix (``body.0.weight`` and ``body.0.bias`` are LeNet's layer 1, ``fc.*`` its
Linear layer 4); a string is that prefix (``"fc"``); one that some configured case's model
lacks is refused before any job (``check_config``). Strength knob ``magnitude``.

The adaptive attacker (decision 0097) matches the upload's expectation over the noise, the trial
gradient itself (the noise is zero-mean), as for DP (``differential_privacy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from gradleak import models
from gradleak.config import ConfigError
from gradleak.data import datasets
from gradleak.defenses.base import Defense, DefenseContext, register
from gradleak.types import Update


def layer_names(model: nn.Module) -> list[str]:
    """The model's layers with parameters, from the input: each one's name prefix."""
    layers: list[str] = []
    for name, _ in model.named_parameters():
        prefix = name.rsplit(".", 1)[0] if "." in name else name
        if prefix not in layers:
            layers.append(prefix)
    return layers


def layer_parameters(model: nn.Module, layer: int | str) -> list[str]:
    """The parameter names of ``layer`` (an index from 1, negative from the end, or a name
    prefix); ValueError naming the layers there are when it matches none."""
    layers = layer_names(model)
    if isinstance(layer, bool) or not isinstance(layer, (int, str)):
        prefix = None
    elif isinstance(layer, int):
        index = layer - 1 if layer > 0 else len(layers) + layer if layer < 0 else len(layers)
        prefix = layers[index] if 0 <= index < len(layers) else None
    else:
        prefix = layer
    names = [] if prefix is None else [
        n for n, _ in model.named_parameters() if n == prefix or n.startswith(prefix + ".")]
    if not names:
        raise ValueError(f"layer_noise: layer {layer!r} matches no layer of the model; expected "
                         f"1 .. {len(layers)}, -{len(layers)} .. -1 or a name prefix, one of "
                         f"{layers}")
    return names


@register("layer_noise")
class LayerNoise(Defense):
    deterministic = True  # the adaptive attacker's transformation is the identity

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """``layer`` a layer of every configured case's model (a target's swept value: of
        its selection's cases), built on the meta device for the shape and classes its
        dataset's options give (no memory, no weights)."""
        for case in config["cases"]:
            named = f"case {case['dataset']}/{case['model']}"
            shape, classes = datasets.shape(case["dataset"],
                                            config["datasets"].get(case["dataset"], {}))
            try:
                with torch.device("meta"):
                    model = models.for_case(case, shape, classes)
            except ValueError as error:  # the case's own mistake (a shape its model refuses)
                raise ConfigError(f"invalid config: {named}: {error}") from None
            try:
                layer_parameters(model, params["layer"])
            except ValueError:
                layers = layer_names(model)
                raise ConfigError(f"invalid config: '{where}.layer': {params['layer']!r} is not "
                                  f"a layer of the model of {named}; expected 1 .. "
                                  f"{len(layers)}, -{len(layers)} .. -1 or one of {layers}",
                                  key=f"{where}.layer") from None

    def __init__(self, *, magnitude: float, layer: int | str) -> None:
        self.magnitude, self.layer = magnitude, layer

    def __call__(self, ctx: DefenseContext) -> Update:
        chosen = set(layer_parameters(ctx.model, self.layer))
        out = Update()
        for name, g in ctx.true_gradient().items():
            if name in chosen:
                u = torch.rand(g.shape, generator=ctx.rng).to(device=g.device, dtype=g.dtype)
                g = g + self.magnitude * (2 * u - 1)
            out[name] = g
        return out

    def adaptive(self, trial: Update, ctx: DefenseContext, received: Update) -> Update:
        """E[upload] = trial: the noise is zero-mean."""
        return trial
