"""Problems that each keep their own one-problem optimiser, evaluated together.

torch's L-BFGS minimises one problem: stepping stacked problems with one L-BFGS would
share its step and curvature pairs between them. :func:`in_lockstep` instead runs each
problem's own :func:`~gradleak.attacks.optimization.optimize` (its L-BFGS, its stopper) in
a thread of its own; the objective of each blocks until every problem still running waits
for its own, and one stacked evaluation in the caller's thread then serves them all (DLG
and iDLG's victims x restarts, ``engine``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from gradleak.attacks.optimization import Objective, Trajectory


class _Lockstep:
    """The shared objective of problems run in threads of their own: once every problem
    still running waits for its objective, the caller's thread evaluates them all (torch
    runs several times slower in a second thread while the first one's are idle)."""

    def __init__(self, problems: int) -> None:
        self.condition = threading.Condition()
        self.running, self.waiting = set(range(problems)), set()
        self.round, self.results, self.error = 0, None, None

    def objective(self, problem: int) -> Objective:
        def shared() -> tuple[torch.Tensor, list[torch.Tensor]]:
            with self.condition:
                self.waiting.add(problem)
                round_ = self.round
                self.condition.notify_all()
                self.condition.wait_for(lambda: self.round != round_ or self.error is not None)
                if self.round == round_:
                    raise RuntimeError("another problem's evaluation failed") from self.error
                mine = slice(problem, problem + 1)
                loss, gradients = self.results
                return loss[mine], [g[mine] for g in gradients]

        return shared

    def leave(self, problem: int) -> None:
        with self.condition:
            self.running.discard(problem)
            self.condition.notify_all()

    def serve(self, evaluate: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
        """Evaluate whenever every running problem waits, until none runs."""
        with self.condition:
            while True:
                self.condition.wait_for(lambda: not self.running or (
                    self.waiting and self.waiting >= self.running))
                if not self.running:
                    return
                try:
                    self.results = evaluate()
                except BaseException as error:
                    self.error = error
                    self.condition.notify_all()
                    raise
                self.waiting, self.round = set(), self.round + 1
                self.condition.notify_all()


def in_lockstep(runs: list[Callable[[Objective], Trajectory]],
                evaluate: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]
                ) -> list[Trajectory]:
    """``runs[p](objective)`` for every problem p in a thread of its own; ``evaluate()``
    (every problem's loss (P,) and per variable the (P, ...) gradients) runs in the
    caller's thread once every problem still running waits, and problem p's objective
    returns its (1,) and (1, ...) rows ``loss[p:p + 1]``, ``g[p:p + 1]``."""
    lockstep = _Lockstep(len(runs))

    def work(problem: int) -> Trajectory:
        try:
            return runs[problem](lockstep.objective(problem))
        finally:
            lockstep.leave(problem)

    with ThreadPoolExecutor(len(runs)) as pool:  # waits for every thread, even on an error
        futures = [pool.submit(work, p) for p in range(len(runs))]
        lockstep.serve(evaluate)
    return [future.result() for future in futures]  # a problem's error raised here
