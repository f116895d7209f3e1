"""Gradient-inversion attacks behind one interface: ``attack(obs) -> Reconstruction``.

``build(name, **params)`` returns an attack with its paper's defaults (from the
configuration schema); ``available()`` lists the registered names.
"""

from fedleak.attacks import (  # noqa: F401  (registration)
    dlg,
    eot,
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
from fedleak.attacks.base import Reconstruction, available, build, needs
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.engine import reconstruct_all
from fedleak.attacks.label_inference import batch_labels, idlg_label, infer_labels
from fedleak.types import Observation

__all__ = ["Observation", "Reconstruction", "Stopper", "available", "build", "batch_labels",
           "idlg_label", "infer_labels", "needs", "reconstruct_all"]
