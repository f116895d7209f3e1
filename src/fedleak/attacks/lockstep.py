"""Problems that each keep their own one-problem optimiser, evaluated together (DESIGN §7).

torch's L-BFGS minimises one problem: stepping stacked problems with one L-BFGS would
share its step and curvature pairs between them. :func:`in_lockstep` instead runs each
problem's own :func:`~fedleak.attacks.optimization.optimize` (its L-BFGS, its stopper) in
a thread of its own; the objective of each blocks until every problem still running waits
for its own, and one stacked evaluation then serves them all (DLG and iDLG:
:func:`restarts_in_lockstep` over victims x restarts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import torch

from fedleak.attacks.optimization import Objective, Trajectory
from fedleak.types import Observation


class _Lockstep:
    """The shared objective of problems run in threads of their own: once every problem
    still running waits for its objective, one ``evaluate()`` serves them all."""

    def __init__(self, problems: int,
                 evaluate: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
        self.evaluate, self.condition = evaluate, threading.Condition()
        self.running, self.waiting = set(range(problems)), set()
        self.round, self.results, self.error = 0, None, None

    def objective(self, problem: int) -> Objective:
        def shared() -> tuple[torch.Tensor, list[torch.Tensor]]:
            with self.condition:
                self.waiting.add(problem)
                round_ = self.round
                self._evaluate_when_all_wait()
                self.condition.wait_for(lambda: self.round != round_ or self.error is not None)
                if self.round == round_:
                    raise RuntimeError("another problem's evaluation failed") from self.error
                loss, gradients = self.results
                return loss[problem], [g[problem] for g in gradients]

        return shared

    def leave(self, problem: int) -> None:
        with self.condition:
            self.running.discard(problem)
            self._evaluate_when_all_wait()

    def _evaluate_when_all_wait(self) -> None:
        if not self.waiting or not self.waiting >= self.running or self.error is not None:
            return
        try:
            self.results = self.evaluate()
        except BaseException as error:
            self.error = error
            self.condition.notify_all()
            raise
        self.waiting, self.round = set(), self.round + 1
        self.condition.notify_all()


def in_lockstep(runs: list[Callable[[Objective], Trajectory]],
                evaluate: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]
                ) -> list[Trajectory]:
    """``runs[p](objective)`` for every problem p, each in a thread of its own: one-problem
    :func:`optimize` runs (L-BFGS's line search and curvature pairs, a stopper, stay the
    problem's own) whose objectives are evaluated together. ``evaluate()`` returns every
    problem's loss (P,) and per variable the (P, ...) gradients at their current
    variables; it runs once every problem still running waits for its objective, so what
    it sees does not depend on the threads' timing. Problem p's objective returns
    ``(loss[p], [g[p] for g in gradients])``."""
    lockstep = _Lockstep(len(runs), evaluate)
    results: list[Trajectory | None] = [None] * len(runs)
    errors: list[BaseException] = []

    def work(problem: int) -> None:
        try:
            results[problem] = runs[problem](lockstep.objective(problem))
        except BaseException as error:  # re-raised in the caller's thread
            errors.append(error)
        finally:
            lockstep.leave(problem)

    threads = [threading.Thread(target=work, args=(p,), daemon=True) for p in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def restarts_in_lockstep(observations: list[Observation], *, restarts: int, seed: int,
                         draw: Callable[[Observation, torch.Generator], list[torch.Tensor]],
                         loss: Callable[[list[torch.Tensor]], torch.Tensor],
                         run: Callable[[list[torch.Tensor], Objective], Trajectory]
                         ) -> list[tuple[int, Trajectory]]:
    """Victims x restarts, each its own one-problem ``run(variables, objective)``, in
    lockstep (:func:`in_lockstep`): victim v draws its restarts' variables in turn from a
    generator seeded ``seed + v``, as the per-victim attack, and ``loss`` maps the stacked
    variables (each (P, ...), victim-major) to the problems' losses (P,). Returns each
    victim's restart of lowest final loss (the first on ties) and its trajectory."""
    problems = []
    for v, obs in enumerate(observations):
        rng = torch.Generator().manual_seed(seed + v)
        problems += [draw(obs, rng) for _ in range(restarts)]

    def evaluate() -> tuple[torch.Tensor, list[torch.Tensor]]:
        stacked = [torch.stack([p[i].detach() for p in problems]).requires_grad_(True)
                   for i in range(len(problems[0]))]
        value = loss(stacked)
        return value.detach(), list(torch.autograd.grad(value.sum(), stacked))

    runs = in_lockstep([partial(run, variables) for variables in problems], evaluate)
    chosen = []
    for v in range(len(observations)):
        mine = runs[v * restarts:(v + 1) * restarts]
        best = min(range(restarts), key=lambda r: mine[r].final_loss)
        chosen.append((best, mine[best]))
    return chosen
