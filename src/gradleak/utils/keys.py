"""How a table's key value is matched against a configured one (a claim's rows, a
reference row, a regime entry): numbers to 1e-9 relative, anything else by its text; a
defense label against a :class:`Family` by its family."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """Every defense label of ``label``'s defense whose swept configuration keys agree
    with it, whatever its own paired parameters: ``dp_gaussian~clip=5.6e-05`` and
    ``dp_gaussian~clip=1e-08`` are one family, one curve over the strengths (a matched
    claim's, RecUP-FL); ``~attack.protocol.round=4`` would make another."""

    label: str

    def __contains__(self, other) -> bool:
        return _family(other) == _family(self.label)

    def undefended(self, name: str) -> Family:
        """The undefended label (``name``) of the same sweep: the curve's start."""
        return Family("~".join([name, *_family(self.label)[1]]))


def _family(label) -> tuple[str, tuple[str, ...]]:
    name, *parts = str(label).split("~")
    return name, tuple(p for p in parts if "." in p.partition("=")[0])


def same(a, b) -> bool:
    """Whether a table's key value is a configured one."""
    if isinstance(b, Family):
        return a in b
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (a, b)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0)
    return str(a) == str(b)
