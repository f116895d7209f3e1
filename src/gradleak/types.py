"""Shared types, imported by ``fl``, ``defenses`` and ``attacks`` (a leaf: only torch).

- :class:`Update`: one client's upload, parameter name -> tensor.
- :class:`DefenseContext`: one client's view when it defends its upload.
- :class:`Observation`: what the attacker sees of one upload.
- :class:`Setting`: one point of a configuration's sweep, with one canonical text.
- :class:`Need`: an artifact (network, generator, public data) a defense or attack takes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

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


# artifact kind -> what it is, and the pipeline phase (experiment/phases/<phase>.py) that
# declares its files and loader
ARTIFACTS = {
    "evalnet": ("the trained evaluation network (Refiner §3.3; gradleak train-evalnet)",
                "train_evalnet"),
    "gan": ("a trained generator prior (gradleak train-gan, or gan.weights)", "attack"),
    "untrained_gan": ("the prior's architecture (gan:) with seeded initial weights, untrained",
                      "attack"),
    "giml_generator": ("the generator meta-learned from client gradients (GIML; gradleak "
                       "train-giml)", "train_giml"),
    "public_data": ("public labelled images (x, y), the prepared dataset's public split",
                    "prepare_data"),
    "bn_proxy": ("BatchNorm statistics of public images (GradInversion BN_proxy)", "attack"),
    "defense": ("the defense whose uploads are attacked (a Defense or a registered name)",
                "attack"),
    "model_zoo": ("defender models that infer sensitive attributes from gradients (RecUP-FL "
                  "§4)", "train_zoo"),
    "inverter": ("an inversion network from a setting's uploads to images (Learning to "
                 "Invert; gradleak train-inverter)", "train_inverter"),
}


@dataclass(frozen=True)
class Need:
    """A constructor argument that the experiment layer supplies: an artifact of ``kind``
    (one of ``ARTIFACTS``: ``evalnet``, ``gan``, ``untrained_gan``, ``giml_generator``,
    ``public_data``, ``bn_proxy``, ``model_zoo``, ``inverter``, ``defense``), needed only
    when every parameter named in ``when`` takes one of the values listed there."""

    kind: str
    when: Mapping[str, tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ARTIFACTS:
            raise ValueError(f"unknown artifact kind {self.kind!r}; expected one of "
                             f"{sorted(ARTIFACTS)}")

    def applies(self, params: Mapping[str, Any]) -> bool:
        return all(params.get(key) in values for key, values in self.when.items())


def artifact(kind: str, of: Any = None) -> str:
    """A needed artifact as ``needs_for`` names it: ``kind``, or ``"kind:of"`` for the one of
    ``of`` (the prior trained on dataset ``natural``: ``"gan:natural"``; GIML's generator
    kept at outer step 4: ``"giml_generator:4"``); None: the configuration's own."""
    if kind not in ARTIFACTS:
        raise ValueError(f"unknown artifact kind {kind!r}; expected one of {sorted(ARTIFACTS)}")
    return kind if of is None else f"{kind}:{of}"


def artifact_parts(needed: str) -> tuple[str, str | None]:
    """``"gan:natural"`` -> ``("gan", "natural")``; ``"gan"`` -> ``("gan", None)``."""
    kind, _, of = needed.partition(":")
    return kind, of or None


# ---------------------------------------------------------------------------------------
# Settings

# who attacks a defended upload (decision 0072): the paper's attacker or one that knows the
# defense; tables written before the `attacker` column hold the paper's rows only; the
# strongest: the matched-utility table's worst case over both and every attack (decision 0097)
PAPER, ADAPTIVE, STRONGEST = "paper", "adaptive", "strongest"

_SEPARATOR = "~"
UNDEFENDED = "none"  # the undefended defense label: the reference of PMM
# overrides of what a client uploads and when (local steps, batch, the attacked round)
PROTOCOL_KEYS = ("fl.", "attack.protocol.")
ATTACK_ONLY_KEYS = ("attack.", "attacks.")  # overrides that leave the FL run unchanged
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_KEY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")


def number_text(value: float) -> str:
    """Shortest text that reads back as exactly ``value`` (``4``, ``0.01``, ``1e-05``)."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _encode(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)  # text that would read back as a number, bool or null
        except ValueError:
            return quote(value, safe="+-._")
        return quote(json.dumps(value), safe="")
    return quote(json.dumps(_plain(value), separators=(",", ":")), safe=",:[]{}+-.")


def _decode(text: str) -> Any:
    text = unquote(text)
    try:
        return frozen(json.loads(text))
    except ValueError:
        return text


def _plain(value: Any) -> Any:
    """Tuples back to lists for JSON."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def frozen(value: Any) -> Any:
    """Lists as tuples, so that a Setting is hashable."""
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    if isinstance(value, dict):
        raise ValueError(f"a sweep value must be a number, string, boolean or list, got {value}")
    return value


@dataclass(frozen=True, eq=False)
class Setting:
    """One point of a configuration's sweep: a defense (its configured label) at one
    strength, plus overrides of the configuration.

    An override key without a dot is a parameter of the setting's defense (``beta``);
    a dotted key is a configuration path (``fl.participation``, ``attack.protocol.round``,
    ``attacks.idlg.stopper.threshold``). The canonical text, one path segment, is
    ``<defense>-<strength>`` followed by ``~<key>=<value>`` per override in key order,
    e.g. ``refiner-0.1~beta=0.5``; :meth:`parse` reads it back exactly.
    """

    defense: str
    strength: float
    overrides: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.defense):
            raise ValueError(f"setting defense {self.defense!r} must be a lower-case name")
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float)) \
                or not math.isfinite(self.strength):
            raise ValueError(f"setting strength must be a finite number, got {self.strength!r}")
        object.__setattr__(self, "strength", float(self.strength))
        overrides = tuple(sorted((str(k), frozen(v)) for k, v in dict(self.overrides).items()))
        for key, _ in overrides:
            if not _KEY.fullmatch(key):
                raise ValueError(f"setting override key {key!r} must be a lower-case name or "
                                 f"dotted configuration path")
        object.__setattr__(self, "overrides", overrides)

    @classmethod
    def of(cls, defense: str, strength: float, overrides: Mapping[str, Any] | None = None
           ) -> Setting:
        return cls(defense, strength, tuple((overrides or {}).items()))

    @property
    def text(self) -> str:
        parts = [f"{self.defense}-{number_text(self.strength)}"]
        parts += [f"{key}={_encode(value)}" for key, value in self.overrides]
        return _SEPARATOR.join(parts)

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:  # by text: 1 and 1.0 are different values here
        return isinstance(other, Setting) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)

    @property
    def label(self) -> str:
        """The text without the strength: the defense and its overrides (``refiner~beta=0.5``),
        the name tables give the setting's curve."""
        return _SEPARATOR.join([self.defense, *self.text.split(_SEPARATOR)[1:]])

    @classmethod
    def parse(cls, text: str) -> Setting:
        head, *rest = text.split(_SEPARATOR)
        match = re.fullmatch(r"([a-z][a-z0-9_]*)-(.+)", head)
        if match is None:
            raise ValueError(f"bad setting {text!r}; expected '<defense>-<strength>' followed by "
                             f"'~<key>=<value>' per override, e.g. 'refiner-0.1~beta=0.5'")
        try:
            strength = float(match[2])
        except ValueError:
            raise ValueError(f"bad setting {text!r}: strength {match[2]!r} is not a number") \
                from None
        overrides = []
        for part in rest:
            key, eq, value = part.partition("=")
            if not eq:
                raise ValueError(f"bad setting {text!r}: override {part!r} is not key=value")
            overrides.append((key, _decode(value)))
        setting = cls(match[1], strength, tuple(overrides))
        if setting.text != text:
            raise ValueError(f"setting {text!r} is not in canonical form; write {setting.text!r}")
        return setting

    @property
    def defense_params(self) -> dict[str, Any]:
        """Overrides of the defense's parameters (keys without a dot)."""
        return {k: _plain(v) for k, v in self.overrides if "." not in k}

    @property
    def config_overrides(self) -> dict[str, Any]:
        """Overrides of configuration paths (dotted keys)."""
        return {k: _plain(v) for k, v in self.overrides if "." in k}

    def without(self, prefixes: tuple[str, ...]) -> Setting:
        """This setting without the overrides whose key starts with one of ``prefixes``."""
        kept = tuple((k, v) for k, v in self.overrides if not k.startswith(prefixes))
        return Setting(self.defense, self.strength, kept)

    @property
    def reference(self) -> Setting:
        """The undefended FL run under this setting's ``fl.`` overrides: PMM's reference."""
        return Setting(UNDEFENDED, 0, tuple(o for o in self.overrides if o[0].startswith("fl.")))


def label_without(label: str, prefixes: tuple[str, ...]) -> str:
    """A setting label without its overrides whose key starts with one of ``prefixes``."""
    head, *parts = label.split(_SEPARATOR)
    return _SEPARATOR.join([head, *(p for p in parts if not p.startswith(prefixes))])


def protocol_of(label: str) -> str:
    """A setting label's protocol overrides (``fl.local_steps=5``; empty: as configured)."""
    return _SEPARATOR.join(p for p in label.split(_SEPARATOR)[1:] if p.startswith(PROTOCOL_KEYS))


def is_ablation(label: str) -> bool:
    """Whether a setting label carries overrides (``refiner~beta=0.5``, :attr:`Setting.label`)."""
    return _SEPARATOR in label
