"""The model zoo of RecUP-FL (§4.2, §5.3 "Model Zoo Setting"): per sensitive attribute,
``size`` (20) defender models, 3-layer fully connected networks (``FeatureNet`` with
three hidden widths) trained to infer the attribute from gradient features.

Each hidden width is drawn independently from the powers of two in ``widths`` (128 ..
2048 by default: 128, 256, 512, 1024, 2048), so the zoo's structures differ. Each model
is initialised and shuffled from its own seed (from ``seed``) and trained like the
adversaries (SGD at lr 0.01 with momentum 0.9, cross-entropy, mini-batches of 32;
the paper gives no separate setting for the defenders).

A saved zoo is a plain dict (format tag, feature size, classes, per attribute a list
of {widths, state dict}) that ``torch.load(weights_only=True)`` reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from gradleak.adversaries.neural import FeatureNet, make_net, train_classifier
from gradleak.utils.io import load_torch, save_torch

FORMAT = "gradleak.model_zoo"
VERSION = 1


@dataclass
class ModelZoo:
    """Defender models per attribute, each mapping (B, feature_size) -> logits."""

    feature_size: int
    classes: dict[str, int]
    models: dict[str, list[nn.Module]]

    def __post_init__(self) -> None:
        if set(self.classes) != set(self.models):
            raise ValueError(f"model zoo classes name attributes {sorted(self.classes)} but its "
                             f"models name {sorted(self.models)}; expected the same attributes")
        empty = [a for a, models in self.models.items() if not models]
        if empty:
            raise ValueError(f"model zoo has no models for attribute {empty[0]!r}")
        for attribute, models in self.models.items():
            for model in models:
                width = getattr(model, "features", None)
                if width is not None and width != self.feature_size:
                    raise ValueError(f"model zoo feature size is {self.feature_size} but a "
                                     f"{attribute!r} model takes {width} features")

    @property
    def attributes(self) -> list[str]:
        return list(self.models)

    def to(self, device: torch.device | str) -> ModelZoo:
        """The zoo with every defender model moved (in place) to ``device``."""
        for models in self.models.values():
            for model in models:
                model.to(device)
        return self


def _powers_of_two(widths: tuple[int, int]) -> list[int]:
    low, high = widths
    choices = [2**k for k in range(31) if low <= 2**k <= high]
    if not choices:
        raise ValueError(f"zoo widths {widths} contain no power of two; expected a range "
                         f"(low, high) such as (128, 2048)")
    return choices


def train_zoo(features: torch.Tensor, labels: Mapping[str, torch.Tensor],
              classes: Mapping[str, int], size: int = 20, epochs: int = 80, lr: float = 0.01,
              seed: int = 0, progress: bool = False, widths: tuple[int, int] = (128, 2048),
              batch_size: int = 32, momentum: float = 0.9,
              kept: Callable[[str, Callable[[], dict]], dict] | None = None) -> ModelZoo:
    """``size`` defender models per attribute of ``labels`` (attribute -> (N,) labels),
    trained on ``features`` (N, feature_size). ``kept(name, train)``: model ``name``'s
    weights as a killed job kept them, else ``train()`` (``experiment.resume``)."""
    features = torch.as_tensor(features, dtype=torch.float32)
    if features.ndim != 2:
        raise ValueError(f"train_zoo features must have shape (N, feature_size), "
                         f"got {tuple(features.shape)}")
    if set(labels) != set(classes):
        raise ValueError(f"train_zoo labels name attributes {sorted(labels)} but classes names "
                         f"{sorted(classes)}; expected the same attributes")
    if size < 1:
        raise ValueError(f"train_zoo size must be >= 1, got {size}")
    choices = _powers_of_two(widths)
    rng = np.random.default_rng(seed)
    seeds = np.random.SeedSequence(seed).generate_state(size * len(labels))
    bar = tqdm(total=size * len(labels), desc="model zoo", disable=not progress, leave=False)
    models: dict[str, list[nn.Module]] = {}
    for a, (attribute, y) in enumerate(labels.items()):
        y = torch.as_tensor(y, dtype=torch.int64)
        if tuple(y.shape) != (len(features),) or int(y.min()) < 0 \
                or int(y.max()) >= classes[attribute]:
            raise ValueError(f"train_zoo labels[{attribute!r}] must be ({len(features)},) "
                             f"integers in [0, {classes[attribute]})")
        models[attribute] = []
        for i in range(size):
            hidden = [int(w) for w in rng.choice(choices, size=3)]
            model_seed = int(seeds[a * size + i])

            def trained(hidden=hidden, model_seed=model_seed, y=y, attribute=attribute) -> dict:
                net = make_net(features.shape[1], hidden, classes[attribute], model_seed
                               ).to(features.device)
                train_classifier(net, features, y, epochs=epochs, lr=lr, momentum=momentum,
                                 batch_size=batch_size, seed=model_seed)
                return net.state_dict()
            state = trained() if kept is None else kept(f"{attribute}.{i}", trained)
            net = make_net(features.shape[1], hidden, classes[attribute], model_seed
                           ).to(features.device)
            net.load_state_dict(state)
            models[attribute].append(net.eval().requires_grad_(False))
            bar.update()
    bar.close()
    return ModelZoo(features.shape[1], dict(classes), models)


def save_zoo(path: str | Path, zoo: ModelZoo) -> Path:
    """Write ``zoo`` atomically (temporary file, then rename)."""
    payload: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "feature_size": int(zoo.feature_size),
        "classes": {a: int(c) for a, c in zoo.classes.items()},
        "models": {a: [{"widths": list(m.widths), "state": m.state_dict()} for m in models]
                   for a, models in zoo.models.items()},
    }
    return save_torch(path, payload)


def load_zoo(path: str | Path) -> ModelZoo:
    """The zoo saved at ``path``; ValueError naming the file if it is not one."""
    try:
        payload = load_torch(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"model zoo not found: {path}") from None
    except Exception as error:  # not a torch file, or one weights_only refuses
        raise ValueError(f"{path} is not a model zoo (torch.load failed: {error})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a model zoo: expected a dict with format {FORMAT!r} "
                         f"as save_zoo writes")
    if payload.get("version") != VERSION:
        raise ValueError(f"{path} is a model zoo of version {payload.get('version')!r}; "
                         f"this gradleak reads version {VERSION}")
    size, classes = payload["feature_size"], payload["classes"]
    models: dict[str, list[nn.Module]] = {}
    for attribute, entries in payload["models"].items():
        models[attribute] = []
        for entry in entries:
            net = FeatureNet(size, entry["widths"], classes[attribute])
            net.load_state_dict(entry["state"])
            models[attribute].append(net.eval().requires_grad_(False))
    return ModelZoo(size, dict(classes), models)
