"""One point of a configuration's sweep, :class:`Setting`, with one canonical text (a
leaf, torch-free: the planning code and the workflow read it without importing torch)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

# who attacks a defended upload (decision 0072): the paper's attacker or one that knows the
# defense; tables written before the `attacker` column hold the paper's rows only; the
# strongest: the matched-utility table's worst case over both and every attack (decision 0097)
PAPER, ADAPTIVE, STRONGEST = "paper", "adaptive", "strongest"
_SEPARATOR = "~"
UNDEFENDED = "none"  # the undefended defense label: the reference of PMM
# overrides of what a client uploads and when (local steps, batch, the attacked round)
PROTOCOL_KEYS = ("fl.", "attack.protocol.")
ATTACK_ONLY_KEYS = ("attack.", "attacks.")  # overrides that leave the FL run unchanged
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_KEY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")


def number_text(value: float) -> str:
    """Shortest text that reads back as exactly ``value`` (``4``, ``0.01``, ``1e-05``)."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _encode(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)  # text that would read back as a number, bool or null
        except ValueError:
            return quote(value, safe="+-._")
        return quote(json.dumps(value), safe="")
    return quote(json.dumps(_plain(value), separators=(",", ":")), safe=",:[]{}+-.")


def _decode(text: str) -> Any:
    text = unquote(text)
    try:
        return frozen(json.loads(text))
    except ValueError:
        return text


def _plain(value: Any) -> Any:
    """Tuples back to lists for JSON."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def frozen(value: Any) -> Any:
    """Lists as tuples, so that a Setting is hashable."""
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    if isinstance(value, dict):
        raise ValueError(f"a sweep value must be a number, string, boolean or list, got {value}")
    return value


@dataclass(frozen=True, eq=False)
class Setting:
    """One point of a configuration's sweep: a defense (its configured label) at one
    strength, plus overrides of the configuration.

    An override key without a dot is a parameter of the setting's defense (``beta``);
    a dotted key is a configuration path (``fl.participation``, ``attack.protocol.round``,
    ``attacks.idlg.stopper.threshold``). The canonical text, one path segment, is
    ``<defense>-<strength>`` followed by ``~<key>=<value>`` per override in key order,
    e.g. ``refiner-0.1~beta=0.5``; :meth:`parse` reads it back exactly.
    """

    defense: str
    strength: float
    overrides: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.defense):
            raise ValueError(f"setting defense {self.defense!r} must be a lower-case name")
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float)) \
                or not math.isfinite(self.strength):
            raise ValueError(f"setting strength must be a finite number, got {self.strength!r}")
        object.__setattr__(self, "strength", float(self.strength))
        overrides = tuple(sorted((str(k), frozen(v)) for k, v in dict(self.overrides).items()))
        for key, _ in overrides:
            if not _KEY.fullmatch(key):
                raise ValueError(f"setting override key {key!r} must be a lower-case name or "
                                 f"dotted configuration path")
        object.__setattr__(self, "overrides", overrides)

    @classmethod
    def of(cls, defense: str, strength: float, overrides: Mapping[str, Any] | None = None
           ) -> Setting:
        return cls(defense, strength, tuple((overrides or {}).items()))

    @property
    def text(self) -> str:
        parts = [f"{self.defense}-{number_text(self.strength)}"]
        parts += [f"{key}={_encode(value)}" for key, value in self.overrides]
        return _SEPARATOR.join(parts)

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:  # by text: 1 and 1.0 are different values here
        return isinstance(other, Setting) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)

    @property
    def label(self) -> str:
        """The text without the strength: the defense and its overrides (``refiner~beta=0.5``),
        the name tables give the setting's curve."""
        return _SEPARATOR.join([self.defense, *self.text.split(_SEPARATOR)[1:]])

    @classmethod
    def parse(cls, text: str) -> Setting:
        head, *rest = text.split(_SEPARATOR)
        match = re.fullmatch(r"([a-z][a-z0-9_]*)-(.+)", head)
        if match is None:
            raise ValueError(f"bad setting {text!r}; expected '<defense>-<strength>' followed by "
                             f"'~<key>=<value>' per override, e.g. 'refiner-0.1~beta=0.5'")
        try:
            strength = float(match[2])
        except ValueError:
            raise ValueError(f"bad setting {text!r}: strength {match[2]!r} is not a number") \
                from None
        overrides = []
        for part in rest:
            key, eq, value = part.partition("=")
            if not eq:
                raise ValueError(f"bad setting {text!r}: override {part!r} is not key=value")
            overrides.append((key, _decode(value)))
        setting = cls(match[1], strength, tuple(overrides))
        if setting.text != text:
            raise ValueError(f"setting {text!r} is not in canonical form; write {setting.text!r}")
        return setting

    @property
    def defense_params(self) -> dict[str, Any]:
        """Overrides of the defense's parameters (keys without a dot)."""
        return {k: _plain(v) for k, v in self.overrides if "." not in k}

    @property
    def config_overrides(self) -> dict[str, Any]:
        """Overrides of configuration paths (dotted keys)."""
        return {k: _plain(v) for k, v in self.overrides if "." in k}

    def without(self, prefixes: tuple[str, ...]) -> Setting:
        """This setting without the overrides whose key starts with one of ``prefixes``."""
        kept = tuple((k, v) for k, v in self.overrides if not k.startswith(prefixes))
        return Setting(self.defense, self.strength, kept)

    @property
    def reference(self) -> Setting:
        """The undefended FL run under this setting's ``fl.`` overrides: PMM's reference."""
        return Setting(UNDEFENDED, 0, tuple(o for o in self.overrides if o[0].startswith("fl.")))


def label_without(label: str, prefixes: tuple[str, ...]) -> str:
    """A setting label without its overrides whose key starts with one of ``prefixes``."""
    head, *parts = label.split(_SEPARATOR)
    return _SEPARATOR.join([head, *(p for p in parts if not p.startswith(prefixes))])


def protocol_of(label: str, keys: tuple[str, ...] = PROTOCOL_KEYS) -> str:
    """A setting label's protocol overrides (``fl.local_steps=5``; empty: as configured);
    ``keys``: those whose key starts with one of them (``("fl.",)``: its FL run's)."""
    return _SEPARATOR.join(p for p in label.split(_SEPARATOR)[1:] if p.startswith(keys))


def is_ablation(label: str) -> bool:
    """Whether a setting label carries overrides (``refiner~beta=0.5``, :attr:`Setting.label`)."""
    return _SEPARATOR in label
