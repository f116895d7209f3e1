"""Side-by-side timing shared by the benchmarks: paths run in an order alternated each
repeat after one warm-up of each, summarised as medians with min and max."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def alternating(paths: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Seconds of each path over ``repeats`` timed runs: ``{path}_seconds`` (median),
    ``_min``, ``_max``, and ``stacked_speedup`` (loop / stacked) when both are paths."""
    names = list(paths)
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats + 1):  # the first of each path: warm-up
        for name in names if repeat % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            paths[name]()
            if repeat:
                times[name].append(time.perf_counter() - start)
    row = {}
    for name, values in times.items():
        row[f"{name}_seconds"] = statistics.median(values)
        row[f"{name}_seconds_min"], row[f"{name}_seconds_max"] = min(values), max(values)
    if {"stacked", "loop"} <= set(names):
        row["stacked_speedup"] = row["loop_seconds"] / row["stacked_seconds"]
    return row
