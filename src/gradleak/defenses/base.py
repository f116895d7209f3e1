"""The defense interface and registry: ``defense(ctx) -> Update``.

Each defense has one strength knob, named in the schema (``config.knob``), that the
workflow sweeps; ``build`` fills the other parameters from the schema's defaults.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from gradleak import config
from gradleak.needs import Need
from gradleak.types import DefenseContext, Update
from gradleak.utils.registry import Registry


class Defense(ABC):
    """Base class: subclasses implement ``__call__`` and may declare ``needs``."""

    name: str = ""
    needs: ClassVar[dict[str, Need]] = {}
    # the adaptive attacker's transformation has no randomness: one sample suffices (EOT)
    deterministic: ClassVar[bool] = False

    @abstractmethod
    def __call__(self, ctx: DefenseContext) -> Update:
        """The update to upload."""

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """ConfigError naming ``where`` (the parameters' key path) unless the resolved
        ``params`` fit the pipeline's ``config`` (a rule of this defense between its
        parameters and another section); before any job. None by default."""
        return None

    def many(self, ctxs: Sequence[DefenseContext]) -> list[Update]:
        """The uploads of several client batches, each as ``self(ctx)`` makes it alone; a
        defense that can share work between them (RecUP-FL's zoo passes) overrides it."""
        return [self(ctx) for ctx in ctxs]

    def sample(self, trial: Update, ctx: DefenseContext) -> Update:
        """One draw of the defense applied to ``trial``, the gradient of the batch in ``ctx``,
        differentiably: what an adaptive attacker (EOT) averages. By default the defense
        itself run on ``trial``."""
        return self(DefenseContext(ctx.model, ctx.x, ctx.y, ctx.rng, gradient=trial,
                                   attributes=ctx.attributes))

    def adaptive(self, trial: Update, ctx: DefenseContext, received: Update) -> Update:
        """The adaptive attacker's transformation of its ``trial`` gradient (decision 0072): what
        an attacker who knows the defense matches to the ``received`` upload, differentiably
        in ``trial``. By default one draw of :meth:`sample` (EOT over the defense's
        randomness); a defense with a known transformation (pruning, quantisation,
        clipping, Soteria) overrides it, reading what it needs from ``received``."""
        return self.sample(trial, ctx)

    def adaptive_many(self, trials: Sequence[Update], ctxs: Sequence[DefenseContext],
                      received: Sequence[Update]) -> list[Update]:
        """:meth:`adaptive` of several problems (trial i with ``ctxs[i]`` and
        ``received[i]``), each as if alone; RecUP-FL overrides it to share work."""
        return [self.adaptive(t, c, r) for t, c, r in zip(trials, ctxs, received)]

    @property
    def knob(self) -> str | None:
        return config.knob(self.name)

    @property
    def strength(self) -> float:
        return 0.0 if self.knob is None else float(getattr(self, self.knob))


_REGISTRY = Registry("defenses")
register = _REGISTRY.register
available = _REGISTRY.available
needs = _REGISTRY.needs
registered = _REGISTRY.get  # the defense class of a name
knob = config.knob


def build(name: str, **params) -> Defense:
    """A defense by registered name; ``params`` override its schema defaults (the papers')."""
    return _REGISTRY.build(name, **params)


def strongest(name: str, strengths: list[float]) -> float:
    """The strongest of ``strengths`` for defense ``name``."""
    _REGISTRY.get(name)
    return (min if config.stronger(name) == "lower" else max)(strengths)


def build_at(name: str, strength: float, **params) -> Defense:
    """A defense with its strength knob set to ``strength``."""
    key = knob(name)
    if key is None:
        if strength != 0:
            raise ValueError(f"defense {name!r} has no strength knob; strength must be 0, "
                             f"got {strength}")
        return build(name, **params)
    return build(name, **{**params, key: strength})
