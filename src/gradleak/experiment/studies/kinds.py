"""Every study kind, registered: importing this module fills ``registry.STUDIES``."""

from gradleak.experiment.studies import (  # noqa: F401  (registration)
    defense_cost,
    evalnet_blend,
    perturbation,
    refiner_init,
)
from gradleak.experiment.studies.registry import STUDIES

__all__ = ["STUDIES"]
