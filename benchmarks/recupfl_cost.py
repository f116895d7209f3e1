"""Seconds per client update of RecUP-FL and its baselines (RecUP-FL Table 1).

RecUP-FL (P = 10, Q = 5, epsilon 0.001, protecting ``ink``), DP-Gaussian, DP-Laplace,
gradient sparsification (``pruning``) and Soteria, each built with
``defenses.build`` at the strength below, defend the same uploads: a LeNet's gradient
of one client batch (``--batches``, default 20 and 1) of the embedded digits at 16x16
(and, with ``--cifar``, the digits at CIFAR's 3x32x32). RecUP-FL's zoo is the paper's:
20 defender models with hidden widths drawn from 128 .. 2048 on 256 gradient features,
trained briefly (``--zoo-epochs``) on per-sample features of the first 600 digits (the
time per update does not depend on how well the zoo is trained). Protecting M
attributes costs M times the perturbation.

Each repeat takes the next batch and runs every defense on it, the order rotated by
one per repeat so that machine noise hits all alike; wall and process CPU time
(``time.process_time``, robust to other processes on a shared machine) are reported as
median and interquartile range, with each defense's ratio to DP-Gaussian and to Soteria
(ratios of medians).

    python benchmarks/recupfl_cost.py [--batches 20 1] [--repeats 15] [--threads 1]
        [--cifar] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from fedleak import data, defenses, models
from fedleak.adversaries import features_of, train_zoo

DEFENSES = {
    "recupfl": {"epsilon": 0.001, "iterations": 10, "models": 5},
    "dp_gaussian": {"sigma": 0.01},
    "dp_laplace": {"scale": 0.01},
    "pruning": {"ratio": 0.2},
    "soteria": {"ratio": 0.1},
}
ATTRIBUTE = "ink"


def zoo_for(model: torch.nn.Module, images: data.ImageData, args: argparse.Namespace):
    """The paper's zoo shape (20 models, widths 128 .. 2048) on ``--feature-size``
    features of the first 600 images, trained for ``--zoo-epochs``."""
    x, y = images.x[:600], images.y[:600]
    features = features_of(model, x, y, args.feature_size)
    labels = images.attributes[ATTRIBUTE][:600]
    return train_zoo(features, {ATTRIBUTE: labels}, {ATTRIBUTE: 3}, size=args.zoo_size,
                     epochs=args.zoo_epochs, widths=(128, 2048), seed=0)


def time_shape(shape: str, channels: int, size: int, args: argparse.Namespace) -> list[dict]:
    images = data.load("digits", channels=channels, size=size)
    torch.manual_seed(0)
    model = models.build("lenet", channels, 10, size)
    zoo = zoo_for(model, images, args)
    built = {name: defenses.build(name, **({"zoo": zoo} if name == "recupfl" else {}),
                                  **params) for name, params in DEFENSES.items()}
    names = list(built)
    rows = []
    for batch in args.batches:
        for r in range(args.repeats + 1):  # repeat 0 warms up (Soteria's scripted Jacobian)
            part = 600 + (r * batch + torch.arange(batch)) % (len(images) - 600)  # unseen
            x, y = images.x[part], images.y[part]
            attributes = {ATTRIBUTE: images.attributes[ATTRIBUTE][part]}
            for name in names[r % len(names):] + names[:r % len(names)]:
                ctx = defenses.DefenseContext(model, x, y, torch.Generator().manual_seed(r),
                                              attributes=attributes)
                wall, cpu = time.perf_counter(), time.process_time()
                built[name](ctx)
                if r:
                    rows.append({"shape": shape, "batch": batch, "defense": name, "repeat": r,
                                 "wall_s": time.perf_counter() - wall,
                                 "cpu_s": time.process_time() - cpu})
        done = pd.DataFrame(rows).query("batch == @batch")
        medians = done.groupby("defense", sort=False)["cpu_s"].median()
        print(f"{shape} batch {batch}, median CPU seconds: "
              + ", ".join(f"{name} {value:.4f}" for name, value in medians.items()), flush=True)
    return rows


def summarise(times: pd.DataFrame) -> pd.DataFrame:
    """Per defense: median and interquartile range of CPU and wall time, and the ratios of
    the medians to DP-Gaussian's and Soteria's."""
    grouped = times.groupby(["shape", "batch", "defense"], sort=False)
    columns = {}
    for clock in ("cpu", "wall"):
        seconds = grouped[f"{clock}_s"]
        median = seconds.median()
        columns[f"{clock}_s"] = median
        columns[f"{clock}_iqr"] = seconds.quantile(0.75) - seconds.quantile(0.25)
        for baseline in ("dp_gaussian", "soteria"):
            reference = median.xs(baseline, level="defense")
            columns[f"{clock}_vs_{baseline}"] = median / reference.reindex(
                median.index.droplevel("defense")).to_numpy()
    return pd.DataFrame(columns).reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[20, 1])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cifar", action="store_true", help="also the digits at 3x32x32")
    parser.add_argument("--feature-size", type=int, default=256)
    parser.add_argument("--zoo-size", type=int, default=20)
    parser.add_argument("--zoo-epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="CSV of every timing (and FILE_summary.csv)")
    args = parser.parse_args()
    if args.repeats < 1 or min(args.batches) < 1:
        parser.error("--repeats and --batches must be at least 1")
    torch.set_num_threads(args.threads)
    shapes = [("digits 1x16x16", 1, 16)] + ([("digits 3x32x32", 3, 32)] if args.cifar else [])
    times = pd.DataFrame([row for shape in shapes for row in time_shape(*shape, args)])
    summary = summarise(times)
    pd.set_option("display.width", 200)
    print(f"\nseconds per client update, {args.threads} thread(s), {args.repeats} repeats "
          f"(median, IQR; ratios of medians):")
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        times.to_csv(args.out, index=False, float_format="%.6g", lineterminator="\n")
        summary.to_csv(args.out.with_name(args.out.stem + "_summary.csv"), index=False,
                       float_format="%.6g", lineterminator="\n")


if __name__ == "__main__":
    main()
