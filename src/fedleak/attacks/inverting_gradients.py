"""Inverting Gradients (Geiping et al., NeurIPS 2020, §4, Eq. 4).

argmin_x 1 - <g(x), g> / (||g(x)|| ||g||) + lambda_TV TV(x) over the box [0, 1],
with the cosine taken over all layers at once. Adam (lr 0.1) on the sign of the
gradient, lr x 0.1 at 3/8, 5/8 and 7/8 of 24,000 iterations, x from N(0, 1),
lambda_TV = 1e-4, best of ``restarts`` by final loss. Labels: the observed ones
when the attacker knows them, else the iDLG rule (batch of one). A
``trial_transform`` T (EOT) makes the objective match T(g(x), x) to g.

``reconstruct_many`` attacks several victims of one round at once with
:func:`~fedleak.attacks.optimization.optimize_vectorised` (victims x restarts
as one batch); victim v draws its restarts from a generator seeded ``seed + v``, so
it starts from the images that ``InvertingGradients(seed=seed + v)(obs)`` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import torch
from tqdm import tqdm

from fedleak.attacks.base import Reconstruction, register, stopper_from
from fedleak.attacks.early_stopping import Stopper
from fedleak.attacks.label_inference import idlg_label
from fedleak.attacks.objectives import Candidate, compose
from fedleak.attacks.optimization import (
    best_of_restarts,
    clamp_unit,
    optimize,
    optimize_vectorised,
)
from fedleak.attacks.stacked_gradients import StackedModel
from fedleak.types import Observation, Update

MILESTONES = (3 / 8, 5 / 8, 7 / 8)


@register("inverting_gradients")
class InvertingGradients:
    def __init__(self, *, iterations: int, lr: float, tv: float, restarts: int, signed: bool,
                 boxed: bool, distance: str, stopper: dict | None, seed: int = 0) -> None:
        self.iterations, self.lr, self.tv, self.restarts = iterations, lr, tv, restarts
        self.signed, self.boxed, self.distance, self.seed = signed, boxed, distance, seed
        self.stopper = stopper_from(stopper)

    def __call__(self, obs: Observation, stopper: Stopper | None = None,
                 trial_transform: Callable[[Update, torch.Tensor], Update] | None = None,
                 snapshots: Collection[int] = ()) -> Reconstruction:
        labels = obs.labels.to(obs.device) if obs.labels is not None else idlg_label(obs)
        target = obs.target_gradient()
        names = [n for n, _ in obs.model.named_parameters()]
        loss_of = compose(self.distance, {"tv": self.tv})
        rng = torch.Generator().manual_seed(self.seed)

        def run_once(_: int):
            x = obs.randn((obs.batch_size, *obs.input_shape), rng).requires_grad_(True)

            def objective() -> torch.Tensor:
                trial = Update.of(obs.model, x, labels, create_graph=True)
                if trial_transform is not None:
                    trial = trial_transform(trial, x)
                return loss_of([trial[n] for n in names], target, Candidate(x))

            return optimize([x], objective, optimizer="adam", lr=self.lr,
                            iterations=self.iterations, signed=self.signed,
                            milestones=MILESTONES, project=clamp_unit if self.boxed else None,
                            stopper=stopper or self.stopper, snapshot_at=snapshots,
                            render=lambda v: v[0])

        best, index, seconds = best_of_restarts(run_once, self.restarts)
        return Reconstruction(best.variables[0].detach().clamp(0, 1), labels, best.loss_trace,
                              best.iterations, seconds, best.stop_reason, restart=index,
                              snapshots=best.snapshots)

    def reconstruct_many(self, observations: list[Observation], progress: str | None = None
                         ) -> list[Reconstruction]:
        """One Reconstruction per observation, victims x restarts optimised together.

        The observations must share the model object, batch size and input shape; victim v
        uses seed ``self.seed + v``. Every problem runs all iterations (no stopper). The
        victims go in chunks of ``StackedModel.problems_per_step`` problems (victims x
        restarts; ResNet-18 on 32x32 images: 13, so one victim a chunk at 8 restarts),
        with a progress bar over victims labelled ``progress``; ``wall_time`` is the
        victim's share of its chunk.
        """
        if not observations:
            raise ValueError("reconstruct_many needs at least one observation, got none")
        if self.stopper is not None:
            raise ValueError(f"reconstruct_many runs every iteration; got stopper={self.stopper}, "
                             "expected None (use reconstruct_all to loop with a stopper)")
        first = observations[0]
        for v, obs in enumerate(observations):
            if obs.model is not first.model:
                raise ValueError(f"observation {v} has another model object; expected the "
                                 "same model for every observation")
            if (obs.batch_size, obs.input_shape) != (first.batch_size, first.input_shape):
                raise ValueError(f"observation {v} has batch_size {obs.batch_size} and "
                                 f"input_shape {obs.input_shape}; expected {first.batch_size} "
                                 f"and {first.input_shape} like observation 0")
        probe = torch.zeros(first.batch_size, *first.input_shape, device=first.device)
        chunk = max(1, StackedModel(first.model).problems_per_step(probe) // self.restarts)
        out: list[Reconstruction] = []
        with tqdm(total=len(observations), desc=progress, unit="victim",
                  disable=progress is None, leave=False) as bar:
            for begin in range(0, len(observations), chunk):
                out += self._stacked(observations[begin:begin + chunk], begin)
                bar.update(len(observations[begin:begin + chunk]))
        return out

    def _stacked(self, observations: list[Observation], offset: int) -> list[Reconstruction]:
        """Victims ``offset``, ``offset + 1``, ... as one stacked problem."""
        start = time.perf_counter()
        first = observations[0]
        shape = (first.batch_size, *first.input_shape)

        def starts(v: int, obs: Observation) -> torch.Tensor:
            rng = torch.Generator().manual_seed(self.seed + offset + v)  # as the loop
            return torch.stack([obs.randn(shape, rng) for _ in range(self.restarts)])

        images = torch.stack([starts(v, obs) for v, obs in enumerate(observations)])
        labels = torch.stack([obs.labels.to(obs.device) if obs.labels is not None
                              else idlg_label(obs) for obs in observations])
        names = [n for n, _ in first.model.named_parameters()]
        targets = {n: torch.stack([obs.gradient[n].detach().to(first.device)
                                   for obs in observations]) for n in names}
        run = optimize_vectorised(first.model, images, labels, targets, distance=self.distance,
                                  tv=self.tv, lr=self.lr, iterations=self.iterations,
                                  signed=self.signed, milestones=MILESTONES, boxed=self.boxed)
        best = run.best_restart()
        chosen = run.images[torch.arange(len(observations), device=best.device), best]
        # the one host sync of the chunk
        trace, counts, diverged, best = (t.cpu() for t in (run.loss_trace, run.iterations,
                                                            run.diverged, best))
        share = (time.perf_counter() - start) / len(observations)
        out = []
        for v in range(len(observations)):
            r = int(best[v])
            steps = int(counts[v, r])
            out.append(Reconstruction(
                chosen[v].detach().clamp(0, 1), labels[v], trace[:steps, v, r].tolist(), steps,
                share, "diverged" if diverged[v, r] else "max_iterations", restart=r,
                extra={"vectorised_problems": len(observations) * self.restarts}))
        return out
