"""Improved DLG (iDLG; Zhao, Mopuri and Bilen, 2020, §3).

The label is read off the last layer's weight gradient (``label_inference``),
then only the dummy image is optimised with L-BFGS (lr 1, 300 steps) on the
squared L2 gradient distance, as in DLG. ``restarts`` as in ``dlg`` (default 1).
"""

from __future__ import annotations

from gradleak.attacks.base import register
from gradleak.attacks.dlg import DLG
from gradleak.attacks.label_inference import idlg_label
from gradleak.attacks.stage import Stage, image_start
from gradleak.attacks.victims import Victims


@register("idlg")
class IDLG(DLG):
    """DLG with the label read from the last layer's gradient: only the image is optimised."""

    def stage(self, victims: Victims) -> Stage:
        return Stage("l2", self.lr, self.iterations, draw=image_start, labels=idlg_label,
                     optimizer=self.optimizer, stopper=self.stopper)
