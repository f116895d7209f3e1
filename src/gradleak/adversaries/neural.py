"""Fully connected attribute classifiers on gradient features (RecUP-FL §5.3, §5.4).

``FeatureNet`` standardises its input with the training set's per-feature mean and
standard deviation (buffers, saved with the weights; a standard deviation below 1e-6
of the largest one is raised to that floor, so near-constant features are not blown
up), then applies Linear + ReLU per hidden width and a Linear output layer. Feature
standard deviations span 3e-5 .. 0.45 on a LeNet's gradients; measured (digits, 700
training samples, 64 features, ink tercile, chance 0.375), Stru-NN reaches 0.705 test
accuracy standardised and 0.44 on raw features (0.585 and 0.275 with plain SGD). An
"n-layer" network has n hidden widths (Unkwn-NN's four: 1024, 1024, 512, 128), plus
the output layer.

Training: SGD at lr 0.01 on cross-entropy for 80 epochs (§5.4 (1)), in mini-batches
of 32 shuffled by the seed, with momentum 0.9 (the paper does not state momentum;
measured on digits LeNet gradients, 700 training samples, 64 features, ink tercile,
plain SGD under-fits: Stru-NN 0.59 test / 0.65 train accuracy, Unkwn-NN 0.57 / 0.64,
against 0.71 / 0.87 and 0.71 / 0.88 with momentum 0.9 in the same time;
``momentum=0`` gives plain SGD).

- ``stru_nn``: 3 hidden layers of the model zoo's family (widths 512, 256, 128, all
  within the zoo's 128 .. 2048).
- ``unkwn_nn``: 4 hidden layers 1024, 1024, 512, 128 (§5.4 (2)), not in the zoo.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gradleak.adversaries.base import Adversary, as_features, as_labels, register


class FeatureNet(nn.Module):
    """(B, features) -> (B, classes) logits: standardisation, then Linear/ReLU layers."""

    def __init__(self, features: int, widths: Sequence[int], classes: int) -> None:
        super().__init__()
        if features < 1 or classes < 2 or not widths or min(widths) < 1:
            raise ValueError(f"FeatureNet needs features >= 1, classes >= 2 and at least one "
                             f"positive hidden width, got features={features}, "
                             f"widths={list(widths)}, classes={classes}")
        self.features, self.widths, self.classes = int(features), [int(w) for w in widths], \
            int(classes)
        self.register_buffer("center", torch.zeros(features))
        self.register_buffer("scale", torch.ones(features))
        layers: list[nn.Module] = []
        for width_in, width_out in zip([features, *self.widths[:-1]], self.widths):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        self.layers = nn.Sequential(*layers, nn.Linear(self.widths[-1], classes))

    @torch.no_grad()
    def standardise_from(self, x: torch.Tensor) -> None:
        """Set the input standardisation to ``x``'s per-feature mean and std (floored)."""
        std = x.std(dim=0) if len(x) > 1 else torch.ones(x.shape[1])
        floor = max(float(std.max()) * 1e-6, 1e-30)
        self.center.copy_(x.mean(dim=0))
        self.scale.copy_(std.clamp_min(floor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers((x - self.center) / self.scale)

    @torch.no_grad()
    def input_gradient(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(B, features): row i is d CE(self(x[i]), labels[i]) / d x[i], each row's own loss,
        for inputs ``x`` of shape (B, features), without a graph (RecUP-FL takes 50 per
        update): the backward ops autograd runs, in its order, so one row's result is
        bit-identical to ``torch.autograd.grad``."""
        linears = list(self.layers)[::2]
        h = (x - self.center) / self.scale
        hidden = []
        for layer in linears[:-1]:
            h = torch.relu(F.linear(h, layer.weight, layer.bias))
            hidden.append(h)
        out = F.log_softmax(F.linear(h, linears[-1].weight, linears[-1].bias), dim=1)
        grad = torch.zeros_like(out)
        grad[torch.arange(len(out)), labels] = -1.0  # the backward of each row's nll_loss
        grad = torch.ops.aten._log_softmax_backward_data(grad, out, 1, out.dtype)
        for layer, h in zip(linears[:0:-1], hidden[::-1]):
            grad = torch.ops.aten.threshold_backward(grad @ layer.weight, h, 0)  # ReLU's
        return (grad @ linears[0].weight) / self.scale


def make_net(features: int, widths: Sequence[int], classes: int, seed: int) -> FeatureNet:
    """A FeatureNet initialised from ``seed`` (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FeatureNet(features, widths, classes)


def train_classifier(net: FeatureNet, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
                     lr: float, momentum: float, batch_size: int, seed: int) -> FeatureNet:
    """Standardise on ``x``, then SGD on cross-entropy; returns ``net`` in eval mode."""
    if epochs < 0 or lr <= 0 or momentum < 0 or batch_size < 1:
        raise ValueError(f"training needs epochs >= 0, lr > 0, momentum >= 0 and "
                         f"batch_size >= 1, got epochs={epochs}, lr={lr}, "
                         f"momentum={momentum}, batch_size={batch_size}")
    device = net.center.device
    x, y = x.to(device, torch.float32), y.to(device, torch.int64)
    net.standardise_from(x)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    rng = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=rng).to(device)
        for start in range(0, len(x), batch_size):
            batch = order[start:start + batch_size]
            optimizer.zero_grad()
            F.cross_entropy(net(x[batch]), y[batch]).backward()
            optimizer.step()
    return net.eval()


class NeuralAdversary(Adversary):
    """A fully connected adversary (``widths`` hidden layers) trained as in §5.4."""

    def __init__(self, widths: Sequence[int], epochs: int = 80, lr: float = 0.01,
                 momentum: float = 0.9, batch_size: int = 32, seed: int = 0) -> None:
        self.widths, self.epochs, self.lr = list(widths), int(epochs), float(lr)
        self.momentum = float(momentum)
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.net: FeatureNet | None = None

    def fit(self, features: Any, labels: Any) -> NeuralAdversary:
        x = torch.from_numpy(np.ascontiguousarray(as_features(features)))
        y = torch.from_numpy(as_labels(labels, len(x)))
        classes = max(int(y.max()) + 1, 2)
        self.net = make_net(x.shape[1], self.widths, classes, self.seed).to(self.device)
        train_classifier(self.net, x, y, epochs=self.epochs, lr=self.lr,
                         momentum=self.momentum, batch_size=self.batch_size, seed=self.seed)
        return self

    savable = True

    def state(self) -> dict:
        """The fitted network as plain values and tensors, for ``restore``."""
        if self.net is None:
            raise RuntimeError(f"adversary {self.name!r} is not fitted; call fit() first")
        return {"widths": list(self.net.widths), "classes": self.net.classes,
                "features": self.net.features, "net": self.net.state_dict()}

    def restore(self, state: dict) -> NeuralAdversary:
        """This adversary fitted as ``state()`` described it; returns ``self``."""
        if list(state["widths"]) != self.widths:
            raise ValueError(f"adversary {self.name!r} has hidden widths {self.widths}; the "
                             f"saved one has {list(state['widths'])}")
        self.net = FeatureNet(state["features"], self.widths, state["classes"])
        self.net.load_state_dict(state["net"])
        self.net.to(self.device).eval()
        return self

    @torch.no_grad()
    def predict(self, features: Any) -> np.ndarray:
        if self.net is None:
            raise RuntimeError(f"adversary {self.name!r} is not fitted; call fit() first")
        x = torch.from_numpy(np.ascontiguousarray(as_features(features))).to(self.device)
        return self.net(x).argmax(dim=1).cpu().numpy()


@register("stru_nn")
class StruNN(NeuralAdversary):
    """Structure-known NN (§5.4 (1)): 3 hidden layers of the zoo's family."""

    def __init__(self, widths: Sequence[int] = (512, 256, 128), **params: Any) -> None:
        super().__init__(widths, **params)


@register("unkwn_nn")
class UnknownNN(NeuralAdversary):
    """Unknown NN (§5.4 (2)): 4 hidden layers 1024, 1024, 512, 128."""

    def __init__(self, widths: Sequence[int] = (1024, 1024, 512, 128), **params: Any) -> None:
        super().__init__(widths, **params)
