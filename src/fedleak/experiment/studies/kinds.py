"""Every study kind, registered: importing this module fills ``registry.STUDIES``."""

from fedleak.experiment.studies import (  # noqa: F401  (registration)
    defense_cost,
    evalnet_blend,
    perturbation,
    refiner_init,
)
from fedleak.experiment.studies.registry import STUDIES

__all__ = ["STUDIES"]
