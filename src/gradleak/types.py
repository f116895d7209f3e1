"""Shared types of an upload, imported by ``fl``, ``defenses`` and ``attacks`` (a leaf: only
torch).

- :class:`Update`: one client's upload, parameter name -> tensor.
- :class:`DefenseContext`: one client's view when it defends its upload.
- :class:`Observation`: what the attacker sees of one upload.

Torch-free beside it: :mod:`gradleak.settings` (one point of a sweep) and
:mod:`gradleak.needs` (the artifacts a class takes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Update(dict):
    """One client's upload: a dict parameter name -> tensor shaped like that parameter.
    ``info`` carries what a defense reports (e.g. a fallback to the clean gradient); it
    travels with :meth:`map`."""

    def __init__(self, tensors: Mapping[str, torch.Tensor] = (), **info: Any) -> None:
        super().__init__(tensors)
        self.info = {**getattr(tensors, "info", {}), **info}

    @classmethod
    def of(cls, model: nn.Module, x: torch.Tensor, target: torch.Tensor,
           create_graph: bool = False) -> Update:
        """d CE(model(x), target) / d params, keyed like ``model.named_parameters()``;
        ``target``: class indices (B,) or class probabilities (B, classes)."""
        names, params = zip(*model.named_parameters())
        loss = F.cross_entropy(model(x), target)
        return cls(zip(names, torch.autograd.grad(loss, params, create_graph=create_graph)))

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Update:
        """``fn`` applied to every tensor; ``info`` is kept."""
        return Update({k: fn(v) for k, v in self.items()}, **self.info)

    def detached(self) -> Update:
        return self.map(torch.Tensor.detach)

    def norm(self) -> torch.Tensor:
        """The global L2 norm over all tensors (in float64)."""
        return torch.sqrt(sum((g.double() ** 2).sum() for g in self.values()))

    def check(self, model: nn.Module, what: str = "gradient") -> None:
        """Raise ValueError unless the keys and shapes are those of ``model``'s parameters."""
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        if set(self) != set(shapes):
            raise ValueError(f"{what} keys {sorted(self)} do not match the model's parameters "
                             f"{sorted(shapes)}; pass one tensor per model.named_parameters()")
        bad = {n: tuple(g.shape) for n, g in self.items() if tuple(g.shape) != shapes[n]}
        if bad:
            raise ValueError(f"{what} shapes {bad} do not match the model's parameter shapes "
                             f"{ {n: shapes[n] for n in bad} }")


class DefenseContext:
    """One client's view when it defends its upload: the model, its batch, a seeded RNG
    (``rng``, or its older name ``generator``) and, when it is not the plain gradient of the
    batch (local steps), the update itself. ``attributes`` maps each sensitive attribute of
    an attribute task (RecUP-FL) to the batch's integer values, shape (B,); ``None`` for
    image tasks. ``client`` is the client's index in the FL partition (None outside an FL
    run), for a defense configured per client (RecUP-FL §6.4: half protect race, half
    gender)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 rng: torch.Generator | None = None, gradient: Mapping | None = None, *,
                 generator: torch.Generator | None = None,
                 attributes: Mapping[str, torch.Tensor] | None = None,
                 client: int | None = None) -> None:
        if rng is not None and generator is not None:
            raise TypeError("DefenseContext takes rng= or its older name generator=, not both")
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise ValueError(f"DefenseContext x must be a (B, C, H, W) torch.Tensor, got "
                             f"{tuple(getattr(x, 'shape', ())) or type(x).__name__}")
        if not isinstance(y, torch.Tensor) or tuple(y.shape) not in ((x.shape[0],),
                                                                     (x.shape[0], *y.shape[1:2])):
            raise ValueError(f"DefenseContext y must be a torch.Tensor of {x.shape[0]} labels "
                             f"(one per image of x), got "
                             f"{tuple(getattr(y, 'shape', ())) or type(y).__name__}")
        own = getattr(model, "input_shape", None)
        if own is not None and x.shape[1] != tuple(own)[0]:
            raise ValueError(f"DefenseContext x has {x.shape[1]} channels, shape "
                             f"{tuple(x.shape)}, but {type(model).__name__} takes images of "
                             f"shape {tuple(own)}")
        self.model, self.x, self.y = model, x, y
        self.rng = rng or generator or torch.Generator().manual_seed(0)
        self.gradient = None if gradient is None else Update(gradient)
        self.attributes = None if attributes is None else dict(attributes)
        self.client = client
        for key, values in (self.attributes or {}).items():
            if tuple(values.shape) != (x.shape[0],):
                raise ValueError(f"DefenseContext attributes[{key!r}] must have shape "
                                 f"({x.shape[0]},), one value per sample, got "
                                 f"{tuple(values.shape)}")

    def true_gradient(self) -> Update:
        """The undefended update of the client batch (computed once)."""
        if self.gradient is None:
            self.gradient = Update.of(self.model, self.x, self.y).detached()
        return self.gradient


@dataclass
class Observation:
    """What the attacker sees: the model at that round and one (defended) upload."""

    model: nn.Module
    gradient: Mapping[str, torch.Tensor]
    batch_size: int
    labels: torch.Tensor | None = None
    input_shape: tuple[int, int, int] | None = None
    # BN_exact (GradInversion): the client's batch (mean, var) per BatchNorm layer, model order
    bn_statistics: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    # FedAvg: the upload is (theta_0 - theta_K) / local_lr after K local SGD steps, as the
    # server knows them (1: FedSGD, one gradient): each on the batch, or with M
    # ``local_batches`` K / M epochs over it in M mini-batches (``fl.local_epochs``)
    local_steps: int = 1
    local_lr: float | None = None
    local_batches: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"Observation model must be a torch.nn.Module, "
                            f"got {type(self.model).__name__}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or self.batch_size < 1:
            raise ValueError(f"Observation batch_size must be an integer >= 1, "
                             f"got {self.batch_size!r}")
        if not isinstance(self.gradient, Mapping) or not all(
                isinstance(g, torch.Tensor) for g in self.gradient.values()):
            raise TypeError(f"Observation gradient must be a dict parameter name -> "
                            f"torch.Tensor (an Update, e.g. a defense's output), got "
                            f"{_describe(self.gradient)}; pass dict(zip(names, tensors)) with "
                            f"names from model.named_parameters()")
        self.gradient = Update(self.gradient)
        self.gradient.check(self.model)
        own = getattr(self.model, "input_shape", None)
        if self.input_shape is None:
            self.input_shape = own
            if self.input_shape is None:
                raise ValueError(f"Observation needs input_shape=(C, H, W): "
                                 f"{type(self.model).__name__} has no input_shape attribute")
        try:
            self.input_shape = tuple(int(v) for v in self.input_shape)
        except (TypeError, ValueError):
            raise TypeError(f"Observation input_shape must be a tuple (C, H, W) of ints, got "
                            f"{self.input_shape!r}") from None
        if len(self.input_shape) != 3 or min(self.input_shape) < 1:
            raise ValueError(f"Observation input_shape must be (C, H, W) of positive sizes, "
                             f"got {self.input_shape}")
        if own is not None and self.input_shape[0] != tuple(own)[0]:
            raise ValueError(f"Observation input_shape {self.input_shape} has "
                             f"{self.input_shape[0]} channels but "
                             f"{type(self.model).__name__} takes {tuple(own)}; pass "
                             f"input_shape={tuple(own)} or leave it out")
        if self.labels is not None:
            self._check_labels()
        steps, batches, lr = self.local_steps, self.local_batches, self.local_lr
        if not all(type(v) is int and v >= 1 for v in (steps, batches)) or steps % batches \
                or self.batch_size % batches or (steps > 1 and not (
                    isinstance(lr, (int, float)) and lr > 0)):
            raise ValueError(f"Observation local_steps and local_batches must be integers >= 1, "
                             f"local_batches dividing local_steps and batch_size, local_lr > 0 "
                             f"with more than one step; got {steps!r}, {batches!r}, {lr!r}")

    def _check_labels(self) -> None:
        if not isinstance(self.labels, torch.Tensor) or self.labels.is_floating_point() \
                or self.labels.is_complex():
            raise TypeError(f"Observation labels must be an integer torch.Tensor of "
                            f"{self.batch_size} class indices, got "
                            f"{getattr(self.labels, 'dtype', type(self.labels).__name__)}; "
                            f"pass torch.tensor([...]) or labels=None to infer them")
        if tuple(self.labels.shape) != (self.batch_size,):
            raise ValueError(f"Observation labels must have shape ({self.batch_size},), "
                             f"got {tuple(self.labels.shape)}")
        classes = next((p.shape[0] for p in reversed(list(self.model.parameters()))
                        if p.ndim == 2), None)
        if classes is not None and len(self.labels) and (
                int(self.labels.min()) < 0 or int(self.labels.max()) >= classes):
            raise ValueError(f"Observation labels must be class indices in [0, {classes}) "
                             f"for {type(self.model).__name__}'s {classes} outputs, got "
                             f"{self.labels.tolist()}")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def randn(self, shape: tuple[int, ...], rng: torch.Generator) -> torch.Tensor:
        """N(0, 1) drawn on the CPU generator (device-independent), moved to the model's device."""
        return torch.randn(shape, generator=rng).to(self.device)

    def classifier_gradient(self) -> tuple[str, torch.Tensor]:
        """Name and observed gradient of the last 2-D weight (the classifier layer)."""
        names = [n for n, p in self.model.named_parameters() if p.ndim == 2]
        if not names:
            raise ValueError("the model has no Linear layer to read labels from")
        return names[-1], self.gradient[names[-1]]

    @property
    def num_classes(self) -> int:
        return self.classifier_gradient()[1].shape[0]

    def target_gradient(self) -> list[torch.Tensor]:
        """The observed gradient as a list in ``model.named_parameters()`` order."""
        return [self.gradient[n].detach() for n, _ in self.model.named_parameters()]


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        kinds = sorted({type(v).__name__ for v in value.values()})
        return f"a {type(value).__name__} of {', '.join(kinds) or 'nothing'}"
    return type(value).__name__
