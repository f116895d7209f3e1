"""Improved DLG (iDLG; Zhao, Mopuri and Bilen, 2020, §3).

The label is read off the last layer's weight gradient (``label_inference``),
then only the dummy image is optimised with L-BFGS (lr 1, 300 steps) on the
squared L2 gradient distance, as in DLG. ``restarts`` as in ``dlg`` (default 1).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from fedleak.attacks.base import Reconstruction, register
from fedleak.attacks.dlg import DLG
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.label_inference import idlg_label
from fedleak.attacks.objectives import l2_distance
from fedleak.attacks.optimization import Trajectory, best_of_restarts
from fedleak.attacks.stacked_problems import stacked_loss, victim_targets
from fedleak.types import Observation, Update


@register("idlg")
class IDLG(DLG):
    """DLG with the label read from the last layer's gradient: only the image is optimised."""

    def _draw(self, obs: Observation, rng: torch.Generator) -> list[torch.Tensor]:
        """A restart's dummy image, from N(0, 1)."""
        return [obs.randn((obs.batch_size, *obs.input_shape), rng).requires_grad_(True)]

    def __call__(self, obs: Observation, stopper: Stopper | None = None,
                 snapshots: Collection[int] = ()) -> Reconstruction:
        labels = idlg_label(obs)
        rng = torch.Generator().manual_seed(self.seed)
        target = obs.target_gradient()

        def run_once(_: int) -> Trajectory:
            (x,) = variables = self._draw(obs, rng)

            def objective() -> torch.Tensor:
                trial = Update.of(obs.model, x, labels, create_graph=True)
                return l2_distance(list(trial.values()), target)

            return self._optimize(variables, objective, stopper, snapshots)

        best, index, seconds = best_of_restarts(run_once, self.restarts)
        return Reconstruction(best.variables[0].detach().clamp(0, 1), labels, best.loss_trace,
                              best.iterations, seconds, best.stop_reason, restart=index,
                              snapshots=best.snapshots)

    def _stacked_loss(self, observations: list[Observation]):
        """Stacked variables [images] (P, ...) -> the problems' L2 losses."""
        labels = torch.stack([idlg_label(obs) for obs in observations])
        loss_of = stacked_loss(observations[0].model, labels.repeat_interleave(self.restarts, 0),
                               victim_targets(observations), distance="l2")
        return lambda v: loss_of(v[0])

    def _found_labels(self, run: Trajectory, obs: Observation) -> torch.Tensor:
        return idlg_label(obs)
