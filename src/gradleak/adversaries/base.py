"""The adversary interface and registry: attribute-inference classifiers on gradient
features (RecUP-FL §5.4). ``build(name, **params)`` returns an unfitted adversary with
the paper's settings unless ``params`` override them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch


def as_features(features: Any) -> np.ndarray:
    """(N, F) float32 array from an array or tensor."""
    array = features.detach().cpu().numpy() if isinstance(features, torch.Tensor) \
        else np.asarray(features)
    if array.ndim != 2:
        raise ValueError(f"adversary features must have shape (N, F), got {array.shape}")
    return array.astype(np.float32, copy=False)


def as_labels(labels: Any, count: int) -> np.ndarray:
    """(N,) int64 array from an array or tensor, checked against ``count`` samples."""
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) \
        else np.asarray(labels)
    if array.shape != (count,):
        raise ValueError(f"adversary labels must have shape ({count},), one per feature row, "
                         f"got {array.shape}")
    return array.astype(np.int64, copy=False)


class Adversary(ABC):
    """An attribute-inference classifier: ``fit(features, labels)``, then ``predict``."""

    name: str = ""
    # True where ``state()`` and ``restore(state)`` keep the fitted adversary in a
    # ``weights_only`` file (scikit-learn has no byte-stable format that loads without
    # running code: its adversaries are fitted where they are used)
    savable: bool = False
    # where fit and predict run (``to``): the neural adversaries' networks train and predict
    # there; scikit-learn's adversaries run on the CPU whatever it is
    device: torch.device = torch.device("cpu")

    def to(self, device: torch.device | str) -> Adversary:
        """This adversary, fitting and predicting on ``device``; returns ``self``."""
        self.device = torch.device(device)
        return self

    @abstractmethod
    def fit(self, features: Any, labels: Any) -> Adversary:
        """Train on (N, F) features and (N,) integer labels; returns ``self``."""

    @abstractmethod
    def predict(self, features: Any) -> np.ndarray:
        """(N,) predicted labels."""

    def score(self, features: Any, labels: Any) -> float:
        """Accuracy on ``features`` (the attack success rate, RecUP-FL §5.6)."""
        x = as_features(features)
        return float((self.predict(x) == as_labels(labels, len(x))).mean())


_ADVERSARIES: dict[str, type[Adversary]] = {}


def register(name: str):
    """Class decorator: register an adversary under ``name``."""

    def decorator(cls: type[Adversary]) -> type[Adversary]:
        if name in _ADVERSARIES:
            raise ValueError(f"adversary {name!r} registered twice")
        cls.name = name
        _ADVERSARIES[name] = cls
        return cls

    return decorator


def available() -> list[str]:
    return sorted(_ADVERSARIES)


def build(name: str, **params: Any) -> Adversary:
    """An unfitted adversary by registered name; ``params`` override its defaults."""
    if name not in _ADVERSARIES:
        raise ValueError(f"unknown adversary {name!r}; expected one of {available()}")
    return _ADVERSARIES[name](**params)
