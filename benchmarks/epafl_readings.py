"""EPAFL Table 3 (hybrid early stopping on MNIST) under each reading of its plateau and of
its table's statistics (Tabassum et al., §4.2, Alg. 1-2, Table 3; docs/epafl.md).

Each victim (one MNIST test image, the first ``--victims`` of a ``np.random.seed(42)``
permutation as in EPAFL's code, an untrained LeNet with DLG's U(-0.5, 0.5) init) is
attacked once by iDLG for 300 L-BFGS iterations, keeping the loss and the image after
every iteration. L-BFGS on one problem runs the same with or without a stopper up to
where it stops, so every stopper is applied to that one trace (``stop_point``,
tests/test_early_stopping.py checks it against a live stopper) and scored on the image
it would have kept. Readings:

- ``strict``: a new best is any decrease (Alg. 2 and the official code; the pipeline's);
- ``code``: the official code's timing, the loss after each step and P + 1 non-improving
  iterations before the plateau stops (``early_stopping`` module docstring);
- ``rel=r``: a new best must be below best x (1 - r) (``min_improvement``);

each with the table's statistics over every victim (``all``) or, as the official code's
``Succ`` lines, over the successful ones (``successes``; the ASR is over every victim).

    python benchmarks/epafl_readings.py [--mnist-root ../shared/datasets] [--victims 100]
        [--workers 2] [--out-dir benchmarks/out]
"""

from __future__ import annotations

import argparse
import itertools
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gradleak import attacks, data, defenses, metrics, models
from gradleak.attacks.early_stopping import Stopper, stop_point
from gradleak.utils.seeding import seed_everything

ITERATIONS = 300
PATIENCES, THRESHOLDS = (5, 10, 15), (1e-3, 1e-4, 1e-5, 1e-6)
RELATIVE = (1e-4, 1e-3, 1e-2)
PAPER = pd.DataFrame(  # EPAFL Table 3: ASR, SSIM, iterations max / min / mean / SD
    [[5, 1e-3, 0.60, 0.9596, 18, 5, 7.62, 2.346], [5, 1e-4, 0.67, 0.9686, 36, 6, 9.70, 3.879],
     [5, 1e-5, 0.77, 0.9738, 33, 7, 12.43, 3.859], [5, 1e-6, 0.80, 0.9776, 35, 9, 15.29, 5.146],
     [10, 1e-3, 0.62, 0.96, 13, 5, 7.21, 1.815], [10, 1e-4, 0.70, 0.9668, 37, 6, 9.94, 4.157],
     [10, 1e-5, 0.76, 0.9745, 26, 8, 12.62, 3.479], [10, 1e-6, 0.76, 0.9799, 59, 9, 17.17, 7.116],
     [15, 1e-3, 0.62, 0.9596, 16, 5, 7.24, 1.775], [15, 1e-4, 0.66, 0.966, 77, 6, 12.24, 10.07],
     [15, 1e-5, 0.80, 0.9715, 20, 8, 12.04, 2.799], [15, 1e-6, 0.83, 0.9786, 38, 9, 15.58, 5.109]],
    columns=["patience", "threshold", "asr", "ssim", "it_max", "it_min", "it_mean", "it_sd"])


def attack_victim(job: tuple[int, torch.Tensor, torch.Tensor]) -> dict:
    """iDLG without stopping on one victim: its loss trace and SSIM/MSE per iteration."""
    v, x, y = job
    torch.set_num_threads(1)
    seed_everything(v)
    model = models.build("lenet", channels=1, num_classes=10, image_size=x.shape[-1],
                         uniform_init=True)
    ctx = defenses.DefenseContext(model=model, x=x, y=y, rng=torch.Generator())
    observation = attacks.Observation(model=model, gradient=ctx.true_gradient(), batch_size=1,
                                      labels=None)
    seed_everything(v)
    rec = attacks.build("idlg", iterations=ITERATIONS)(observation,
                                                       snapshots=range(ITERATIONS + 1))
    if rec.iterations != ITERATIONS:
        raise RuntimeError(f"victim {v}: the run stopped at {rec.iterations} ({rec.stop_reason})")
    frames = [rec.snapshots[t] for t in range(ITERATIONS + 1)]
    return {"victim": v, "loss": list(rec.loss_trace),
            "ssim": [float(metrics.ssim(f, x)) for f in frames],
            "mse": [float(((f - x) ** 2).mean()) for f in frames]}


def stops(run: dict, reading: str, patience: int, threshold: float) -> int:
    """The iteration at which ``reading``'s hybrid stopper leaves ``run``."""
    if reading == "code":  # the loss after step t is the one L-BFGS returns at step t + 1
        stopper = Stopper("hybrid", threshold=threshold, patience=patience + 1)
        return min(stop_point(stopper, run["loss"][1:])[0], ITERATIONS)
    relative = float(reading.removeprefix("rel=")) if reading.startswith("rel=") else 0.0
    stopper = Stopper("hybrid", threshold=threshold, patience=patience,
                      min_improvement=relative)
    return stop_point(stopper, run["loss"])[0]


def table(runs: list[dict]) -> pd.DataFrame:
    """One row per (reading, statistics, P, T) with Table 3's columns."""
    rows = []
    readings = ["strict", "code", *(f"rel={r:g}" for r in RELATIVE)]
    for reading, (patience, threshold) in itertools.product(
            readings, itertools.product(PATIENCES, THRESHOLDS)):
        at = [stops(run, reading, patience, threshold) for run in runs]
        ssim = np.array([run["ssim"][t] for run, t in zip(runs, at)])
        its = np.array(at, dtype=float)
        success = ssim > 0.9
        for over, keep in (("all", np.ones_like(success)), ("successes", success)):
            kept = its[keep]
            rows.append({"reading": reading, "over": over, "patience": patience,
                         "threshold": threshold, "asr": success.mean(),
                         "ssim": ssim[keep].mean(), "it_max": kept.max(),
                         "it_min": kept.min(), "it_mean": kept.mean(),
                         "it_sd": kept.std(ddof=0)})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mnist-root", default="../shared/datasets")
    parser.add_argument("--victims", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    if args.victims < 1:
        parser.error(f"--victims must be at least 1, got {args.victims}")
    images = data.load_mnist(args.mnist_root, split="test")
    np.random.seed(42)  # EPAFL's code: np.random.permutation after np.random.seed(42)
    picked = np.random.permutation(len(images))[:args.victims]
    jobs = [(v, images.x[i:i + 1], images.y[i:i + 1]) for v, i in enumerate(picked)]
    with Pool(args.workers) as pool:
        runs = []
        for run in pool.imap(attack_victim, jobs):
            runs.append(run)
            print(f"victim {len(runs)}/{len(jobs)}: SSIM after 300 iterations "
                  f"{run['ssim'][-1]:.3f}", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    result = table(runs)
    result.to_csv(args.out_dir / "epafl_readings.csv", index=False)
    paper = PAPER.assign(reading="paper", over="successes?")
    print(pd.concat([result, paper]).sort_values(["patience", "threshold", "reading", "over"])
          .round(4).to_string(index=False))


if __name__ == "__main__":
    main()
