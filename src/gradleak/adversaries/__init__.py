"""Attribute inference from gradients (RecUP-FL §5.3-5.4): gradient features, the
adversaries (``build(name, **params)``: ``stru_nn``, ``unkwn_nn``, ``svm``, ``rf``) and
the defenders' model zoo."""

from gradleak.adversaries import classical, neural  # noqa: F401  (registration)
from gradleak.adversaries.base import Adversary, available, build
from gradleak.adversaries.features import features_of, gradient_features, per_sample_gradients
from gradleak.adversaries.neural import FeatureNet
from gradleak.adversaries.zoo import ModelZoo, load_zoo, save_zoo, train_zoo

__all__ = ["Adversary", "FeatureNet", "ModelZoo", "available", "build", "features_of",
           "gradient_features", "load_zoo", "per_sample_gradients", "save_zoo", "train_zoo"]
