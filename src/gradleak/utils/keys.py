"""How a table's key value is matched against a configured one (a claim's rows, a
reference row, a regime entry): numbers to 1e-9 relative, anything else by its text."""

from __future__ import annotations

import math
import numbers


def same(a, b) -> bool:
    """Whether a table's key value is a configured one."""
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (a, b)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0)
    return str(a) == str(b)
