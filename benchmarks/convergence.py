"""Undefended convergence curves: each attack's PSNR over its iterations, from a finished
run's snapshots, with a 95 % interval over the victims.

A run that saved snapshots (``attack.outputs.snapshots``: the iterations at which every
victim's reconstruction is kept, ``results/attacks/<case>/<setting>/seed<s>/details/
snapshots_<attack>.npy``, uint8 frames of (victims, snapshots + the truth, batch, C, H, W))
gives, per attack and snapshot, the victims' PSNR against their truth (each victim's mean
over its batch; images in [0, 1], uint8 caps it near 59 dB) and the mean with its interval
(``report.intervals.interval``). A reduced scale may run fewer iterations than the paper
only where such a curve shows the shorter budget within 1 dB of the paper's
(``regime.reconstructs[].converged``, decision 0105). For example, Refiner's attacks at
the paper's budgets (the full scale: a reduced scale's cut iterations are what the curve
is to justify) on its CIFAR-10 stand-in; they attack round 0, so one FL round plans them:

    snakemake results/attacks/cifar10-lenet-iid-k10/none-0/seed0/metrics.json --cores all \
        --configfile config/paper/refiner.yaml --config device=cpu \
        "datasets={cifar10: {stand_in: natural, max_images: 6000}}" "fl={rounds: 1, seeds: [0]}" \
        "attack={victims: {count: 16}, outputs: {metrics: [psnr],
                 snapshots: [50, 150, 300, 1000, 2000, 4000]}}"
    python benchmarks/convergence.py results [--setting none-0] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from gradleak.report.intervals import interval
from gradleak.utils.io import write_text


def psnr(images: np.ndarray, truth: np.ndarray) -> float:
    """The mean over a batch of each image's PSNR (uint8 frames, as [0, 1] images)."""
    error = ((images.astype(np.float64) - truth.astype(np.float64)) / 255) ** 2
    mse = error.reshape(len(error), -1).mean(1)
    return float(np.mean(10 * np.log10(1 / np.maximum(mse, 1e-12))))


def curves(results: Path, setting: str) -> pd.DataFrame:
    """A row per case, attack and snapshot: iterations, victims, mean PSNR and interval."""
    rows = []
    for metrics in sorted(results.glob(f"attacks/*/{setting}/seed*/metrics.json")):
        snapshots = json.loads(metrics.read_text()).get("snapshots") or []
        for path in sorted((metrics.parent / "details").glob("snapshots_*.npy")):
            frames = np.load(path, allow_pickle=False)
            for k, iterations in enumerate(snapshots):
                values = np.array([psnr(victim[k], victim[-1]) for victim in frames])
                low, high = interval(values)
                rows.append({"case": metrics.parts[-4], "attack": path.stem[len("snapshots_"):],
                             "iterations": iterations, "victims": len(values),
                             "psnr": values.mean(), "low": low, "high": high})
    if not rows:
        raise SystemExit(f"{results}: no snapshots of setting {setting!r}; expected a run "
                         f"with attack.outputs.snapshots")
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a run's results folder")
    parser.add_argument("--setting", default="none-0", help="the undefended setting")
    parser.add_argument("--out", type=Path, help="also write the table as CSV")
    args = parser.parse_args()
    table = curves(args.results, args.setting)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.out:
        write_text(args.out, table.to_csv(index=False, float_format="%.4g"))


if __name__ == "__main__":
    main()
