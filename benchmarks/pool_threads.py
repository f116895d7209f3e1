"""What a job's native thread pools cost when other jobs hold cores: one thread against every
core, on an idle machine and beside busy processes.

Snakemake counts a job's ``threads`` against ``--cores``; until gradleak held them
(``utils.threads.use_threads``), torch took the configured count but NumPy's and SciPy's
OpenBLAS and scikit-learn's OpenMP took every core. A pool of more threads than free cores
waits at every parallel step for a thread that the scheduler has given to another process.
Three kernels, each the fastest of ``--repeats`` runs, at pools of 1 thread and of every
core, first alone, then beside ``--busy`` processes that spin (default: all cores but one,
as the other jobs of a full ``--cores`` run):

- ``matmul``: 200 NumPy products of 300x300 float64 matrices (OpenBLAS);
- ``lstsq``: 10 ``scipy.linalg.lstsq`` of a 600x400 system (R-GAP's solves are of this kind);
- ``attack``: 20 stacked Inverting Gradients steps, LeNet, 1 victim x 8 restarts, 3x32x32.

    python benchmarks/pool_threads.py [--busy N] [--repeats 3] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.linalg
import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
import attack_throughput  # noqa: E402  (its observations and vectorised path)

from gradleak import models  # noqa: E402


def spin() -> None:
    while True:
        pass


def kernels() -> dict:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 300)), rng.standard_normal((300, 300))
    system, rhs = rng.standard_normal((600, 400)), rng.standard_normal(600)
    model = models.build("lenet", 3, 10, 32)
    observed = attack_throughput.observations(model, 1, 1, torch.device("cpu"), 0)
    params = {"iterations": 20, "restarts": 8, "tv": 1e-4}
    return {"matmul": lambda: [a @ b for _ in range(200)],
            "lstsq": lambda: [scipy.linalg.lstsq(system, rhs) for _ in range(10)],
            "attack": lambda: attack_throughput.vectorised(observed, params)}


def fastest(call, repeats: int) -> float:
    call()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def measure(repeats: int, cores: int) -> dict:
    out = {}
    for name, call in kernels().items():
        for threads in (1, cores):
            with threadpool_limits(threads):
                torch.set_num_threads(threads)
                out[(name, threads)] = fastest(call, repeats)
    return out


def main() -> None:
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=max(cores - 1, 1),
                        help="spinning processes beside the kernels (default: cores - 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if cores < 2:
        raise SystemExit("pool_threads: one core here; the comparison needs two or more")
    alone = measure(args.repeats, cores)
    spinning = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for process in spinning:
        process.start()
    try:
        beside = measure(args.repeats, cores)
    finally:
        for process in spinning:
            process.terminate()
    rows = [{"kernel": name, "threads": threads, "alone_s": alone[(name, threads)],
             "beside_busy_s": beside[(name, threads)]} for name, threads in alone]
    table = pd.DataFrame(rows)
    table["slowdown_beside_busy"] = table["beside_busy_s"] / table["alone_s"]
    print(f"{cores} cores, {args.busy} busy processes beside the kernels")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        table.to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
