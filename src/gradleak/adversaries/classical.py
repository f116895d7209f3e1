"""Non-neural adversaries (RecUP-FL §5.4 (3), (4); Melis et al., Jia and Gong).

- ``svm``: scikit-learn ``SVC`` with an RBF kernel (C = 1, gamma = "scale") on
  features standardised per feature (``StandardScaler``: raw gradient features are
  tiny, and an RBF kernel on them is constant).
- ``rf``: scikit-learn ``RandomForestClassifier`` with 120 trees (scale-free, raw features).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradleak.adversaries.base import Adversary, as_features, as_labels, register


class SklearnAdversary(Adversary):
    """An adversary backed by a scikit-learn estimator in ``self.model``."""

    model: Any

    def fit(self, features: Any, labels: Any) -> SklearnAdversary:
        x = as_features(features)
        self.model.fit(x, as_labels(labels, len(x)))
        self.fitted = True
        return self

    def predict(self, features: Any) -> np.ndarray:
        if not getattr(self, "fitted", False):
            raise RuntimeError(f"adversary {self.name!r} is not fitted; call fit() first")
        return np.asarray(self.model.predict(as_features(features)), dtype=np.int64)


@register("svm")
class SVMAdversary(SklearnAdversary):
    def __init__(self, c: float = 1.0, gamma: str | float = "scale", seed: int = 0) -> None:
        from sklearn.pipeline import make_pipeline  # scikit-learn only when used
        from sklearn.preprocessing import StandardScaler
        from sklearn.svm import SVC

        self.model = make_pipeline(StandardScaler(),
                                   SVC(C=c, kernel="rbf", gamma=gamma, random_state=seed))


@register("rf")
class RandomForestAdversary(SklearnAdversary):
    def __init__(self, trees: int = 120, seed: int = 0) -> None:
        from sklearn.ensemble import RandomForestClassifier

        self.model = RandomForestClassifier(n_estimators=trees, random_state=seed, n_jobs=1)
