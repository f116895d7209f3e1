"""Early stopping for iterative attacks (EPAFL, Tabassum et al., §4.2, Alg. 1 and Alg. 2).

- ``threshold``: stop once the monitored gradient-matching loss is below T (§4.2.1).
- ``plateau``: stop after P consecutive iterations without a new best loss
  (Alg. 2, Is-Trapped-On-Plateau).
- ``hybrid``: stop when either condition holds (Alg. 1). The official code
  implements only this one; EPAFL's best MNIST setting is T = 1e-5, P = 15.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

KINDS = ("threshold", "plateau", "hybrid")


@dataclass
class Stopper:
    kind: str
    threshold: float
    patience: int
    best: float = field(default=math.inf, init=False)
    wait: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"stopper kind must be one of {KINDS}, got {self.kind!r}")
        if self.threshold < 0:
            raise ValueError(f"stopper threshold must be >= 0, got {self.threshold}")
        if self.patience < 1:
            raise ValueError(f"stopper patience must be >= 1, got {self.patience}")

    def reset(self) -> None:
        self.best, self.wait = math.inf, 0

    def update(self, loss: float) -> str | None:
        """Feed one iteration's loss; return why to stop, or None to go on."""
        if self.kind in ("threshold", "hybrid") and loss < self.threshold:
            return "threshold"
        if loss < self.best:
            self.best, self.wait = loss, 0
        else:
            self.wait += 1
        if self.kind in ("plateau", "hybrid") and self.wait >= self.patience:
            return "plateau"
        return None


def copies(stopper: Stopper | None, count: int) -> list[Stopper] | None:
    """``count`` independent copies of ``stopper``, one per stacked problem (None: None)."""
    return None if stopper is None else [copy.deepcopy(stopper) for _ in range(count)]
