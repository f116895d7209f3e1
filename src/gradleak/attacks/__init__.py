"""Gradient-inversion attacks behind one interface: ``attack(obs) -> Reconstruction``.

``build(name, **params)`` returns an attack with its paper's defaults (from the
configuration schema); ``available()`` lists the registered names.
"""

from gradleak.attacks import (  # noqa: F401  (registration)
    dlg,
    eot,
    fan2025,
    gga,
    gias,
    gifd,
    giml,
    gradinversion,
    idlg,
    inverting_gradients,
    lti,
    rgap,
    rog,
)
from gradleak.attacks.base import Attack, available, build, needs
from gradleak.attacks.early_stopping import Stopper
from gradleak.attacks.engine import reconstruct_all
from gradleak.attacks.label_inference import batch_labels, idlg_label, infer_labels
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.stage import Stage, image_start
from gradleak.types import Observation

__all__ = ["Attack", "Observation", "Reconstruction", "Stage", "Stopper", "available", "build",
           "batch_labels", "idlg_label", "image_start", "infer_labels", "needs",
           "reconstruct_all"]
