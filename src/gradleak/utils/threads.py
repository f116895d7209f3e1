"""A job's CPU threads: torch's and those of every native pool it loads (BLAS, OpenMP)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from threadpoolctl import threadpool_limits

# read by OpenBLAS, MKL and OpenMP when a library that uses them loads (SciPy and
# scikit-learn import lazily, after a job has set its threads)
POOL_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def use_threads(threads: int) -> None:
    """``threads`` for torch and for the BLAS and OpenMP pools of NumPy, SciPy and
    scikit-learn, loaded or not (torch reads ``OMP_NUM_THREADS`` where it loads later: a
    light job does not import it for this). Snakemake counts a job's ``threads`` against
    ``--cores``; a pool that takes every core beside other jobs waits at each parallel step
    for a thread that another job holds (docs/measurements.md m104: beside one busy core of
    two, an OpenBLAS product is 7x slower on two threads than on one, SciPy's least squares
    12x, a LeNet attack step 29x)."""
    os.environ.update({name: str(threads) for name in POOL_VARIABLES})
    threadpool_limits(threads)
    if (torch := sys.modules.get("torch")) is not None:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def threads_within(threads: int | None) -> Iterator[None]:
    """:func:`use_threads` for the block, the previous counts restored after it (unchanged
    where ``threads`` is None)."""
    import torch

    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    with threadpool_limits(threads):
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)
