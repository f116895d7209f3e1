"""Timing side by side, for the defense cost study (``experiment.studies.defense_cost``)
and the benchmarks: every repeat runs each call once, the order rotated by one per repeat
so that machine noise (other processes, clock changes, caches) hits all calls alike; the
first ``warmup`` repeats are run and discarded (lazy initialisation, scripted kernels,
allocator growth). On CUDA the device is synchronised before and after each call, so a
call's time includes its queued kernels.

Times are measured, not computed: they differ from run to run and machine to machine;
only their order and ratios are comparable across machines."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from functools import partial

import torch


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(call: Callable[[], object], device: torch.device | str = "cpu"
          ) -> tuple[float, float]:
    """Wall seconds (``time.perf_counter``) and this process's CPU seconds
    (``time.process_time``, robust to other processes on a shared machine) of ``call()``."""
    device = torch.device(device)
    _synchronise(device)
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    _synchronise(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def rotated(calls: dict[Hashable, Callable[[int], object]], repeats: int, warmup: int = 1,
            device: torch.device | str = "cpu",
            done: Callable[[Hashable], object] | None = None
            ) -> dict[Hashable, list[tuple[float, float]]]:
    """(wall, CPU) seconds of ``repeats`` runs of each call, after ``warmup`` discarded
    repeats. Repeat ``r`` (counted from 0, warm-ups included) calls ``call(r)`` for every
    call, starting at the ``r``-th in ``calls``' order; ``done(key)`` after each run (a
    progress bar's update)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"timing needs repeats >= 1 and warmup >= 0, got repeats={repeats}, "
                         f"warmup={warmup}")
    keys = list(calls)
    times: dict[Hashable, list[tuple[float, float]]] = {key: [] for key in keys}
    for r in range(warmup + repeats):
        start = r % len(keys)
        for key in keys[start:] + keys[:start]:
            seconds = timed(partial(calls[key], r), device)
            if r >= warmup:
                times[key].append(seconds)
            if done is not None:
                done(key)
    return times
