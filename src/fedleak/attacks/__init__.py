"""Gradient-inversion attacks behind one interface: ``attack(obs, stopper=None) -> Reconstruction``.

``build(name, **params)`` returns an attack with its paper's defaults;
``available()`` lists the registered names.
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
)
from fedleak.attacks.base import Observation, Reconstruction, available, build, reconstruct_all
from fedleak.attacks.early_stopping import Stopper, build_stopper
from fedleak.attacks.label_inference import batch_labels, idlg_label, infer_labels

__all__ = ["Observation", "Reconstruction", "Stopper", "available", "build", "build_stopper",
           "batch_labels", "idlg_label", "infer_labels", "reconstruct_all"]
