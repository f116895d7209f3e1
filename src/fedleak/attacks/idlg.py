"""Improved DLG (iDLG; Zhao, Mopuri and Bilen, 2020, §3).

The label is read off the last layer's weight gradient (``label_inference``),
then only the dummy image is optimised with L-BFGS (lr 1, 300 steps) on the
squared L2 gradient distance, as in DLG. ``restarts`` as in ``dlg`` (default 1).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from fedleak.attacks.base import Reconstruction, register, stopper_from
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.label_inference import idlg_label
from fedleak.attacks.objectives import l2_distance
from fedleak.attacks.optimization import best_of_restarts, optimize
from fedleak.types import Observation, Update


@register("idlg")
class IDLG:
    def __init__(self, *, iterations: int, lr: float, restarts: int, stopper: dict | None,
                 seed: int = 0) -> None:
        self.iterations, self.lr, self.restarts, self.seed = iterations, lr, restarts, seed
        self.stopper = stopper_from(stopper)

    def __call__(self, obs: Observation, stopper: Stopper | None = None,
                 snapshots: Collection[int] = ()) -> Reconstruction:
        labels = idlg_label(obs)
        rng = torch.Generator().manual_seed(self.seed)
        target = obs.target_gradient()

        def run_once(_: int):
            x = obs.randn((obs.batch_size, *obs.input_shape), rng).requires_grad_(True)

            def objective() -> torch.Tensor:
                trial = Update.of(obs.model, x, labels, create_graph=True)
                return l2_distance(list(trial.values()), target)

            return optimize([x], objective, optimizer="lbfgs", lr=self.lr,
                            iterations=self.iterations, stopper=stopper or self.stopper,
                            snapshot_at=snapshots, render=lambda v: v[0])

        best, index, seconds = best_of_restarts(run_once, self.restarts)
        return Reconstruction(best.variables[0].detach().clamp(0, 1), labels, best.loss_trace,
                              best.iterations, seconds, best.stop_reason, restart=index,
                              snapshots=best.snapshots)
