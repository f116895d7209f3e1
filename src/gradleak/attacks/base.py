"""The attack base class and registry.

An attack is ``attack(obs) -> Reconstruction`` (:class:`Attack`); ``build`` fills its
parameters from the schema's defaults (the papers'), and ``engine.reconstruct_all`` runs
it on the victims of a round.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gradleak.attacks.early_stopping import Stopper
from gradleak.attacks.engine import reconstruct_all
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.attacks.victims import Victims
from gradleak.types import Observation
from gradleak.utils.registry import Registry


class Attack:
    """An optimisation attack stated once: ``stage(victims)`` for one stage, or
    ``reconstruct(victims)`` for several; the engine decides how they run. Subclasses set
    ``restarts``, ``seed`` and ``stopper``; ``forms_gradients`` when each problem's trial
    gradient is formed (an L2 distance, a transformation) and stacking it was measured to
    pay only on small models, ``vectorisable = False`` to take victims one at a time
    (CMA-ES), ``records_snapshots = False`` when snapshots are not one stage's,
    ``sequences = True`` when its cost is its stages' on the victims' uploads alone (no
    reading of ``obs.gradient`` or ``obs.model`` of its own), so that on a sequence victim
    (``gradient_sequence.ObservedSequence``) it sums over the uploads; ``optimizer`` its
    stages' (what `gradleak estimate` prices an iteration as)."""

    restarts: int = 1
    optimizer: str = "adam"
    seed: int = 0
    stopper: Stopper | None = None
    forms_gradients: bool = False
    vectorisable: bool = True
    records_snapshots: bool = True
    sequences: bool = False

    @classmethod
    def budget(cls, params: Mapping[str, Any]) -> int:
        """Gradient-matching iterations of one restart on one victim, from the resolved
        parameters (what `gradleak estimate` prices, ``experiment.estimate``); an attack
        with several stages or none overrides it."""
        return params["iterations"]

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """ConfigError naming ``where`` (the parameters' key path) unless the resolved
        ``params`` fit the pipeline's ``config`` (a rule of this attack between its
        parameters and another section); before any job. None by default."""

    def reconstruct(self, victims: Victims) -> list[Reconstruction]:
        """One Reconstruction per victim of the chunk, from the subclass's ``stage``."""
        return victims.reconstructions(victims.solve(self.stage(victims)))

    def __call__(self, obs: Observation, snapshots: Collection[int] = ()) -> Reconstruction:
        """Reconstruct one victim (its restarts stacked where that pays)."""
        return reconstruct_all(self, [obs], snapshots)[0]



_REGISTRY = Registry("attacks")
register = _REGISTRY.register
available = _REGISTRY.available
needs = _REGISTRY.needs
registered = _REGISTRY.get  # the attack class of a name


def build(name: str, **params):
    """An attack by registered name; ``params`` override its schema defaults (the papers')."""
    return _REGISTRY.build(name, **params)


def stopper_from(spec: dict | Stopper | None) -> Stopper | None:
    """A Stopper from its configuration mapping (None: run every iteration)."""
    if spec is None or isinstance(spec, Stopper):
        return spec
    return Stopper(**spec)
