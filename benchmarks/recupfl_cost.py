"""Seconds per client update of RecUP-FL and its baselines (RecUP-FL Table 1).

RecUP-FL (P = 10, Q = 5, epsilon 0.001, protecting one attribute), DP-Gaussian,
DP-Laplace, gradient sparsification (``pruning``) and Soteria, each built with
``defenses.build`` at the strength below, defend the same uploads: the gradient of one
client batch (``--batches``, default 20 and 1) of

- ``digits``: a LeNet on the embedded digits at 16x16, protecting ``ink``, 256 features;
- ``cifar`` (``--cifar``): the same at CIFAR's 3x32x32;
- ``lfw`` (``--lfw``): Table 1's own setting, LFW's Table 2c CNN (``attribute_cnn``) on
  3x62x47 LFW-shaped stand-in images (the digits), protecting ``race``, 1,024 features as
  config/paper/recupfl.yaml.

RecUP-FL's zoo is the paper's: 20 defender models with hidden widths drawn from 128 ..
2048, trained briefly (``--zoo-epochs``) on per-sample features of the first 600 images
(the time per update does not depend on how well the zoo is trained). Protecting M
attributes costs M times the perturbation.

Each repeat takes the next batch and runs every defense on it, the order rotated by
one per repeat so that machine noise hits all alike (``gradleak.utils.timing.rotated``,
as the pipeline's ``defense_cost`` study, RecUP-FL Table 1's target, times them); wall
and process CPU time (``time.process_time``, robust to other processes on a shared
machine) are reported as median and interquartile range, with each defense's ratio to
DP-Gaussian and to Soteria (ratios of medians).

``--together N ...`` times RecUP-FL's uploads made N at a time (``Defense.many``, as the
attribute track makes them: rows that drew the same zoo model share its passes) against
the same N uploads made one at a time, per upload, at batch 1, rotated in the same way.

    python benchmarks/recupfl_cost.py [--batches 20 1] [--repeats 15] [--threads 1]
        [--cifar] [--lfw] [--together 10 100] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from gradleak import data, defenses, models
from gradleak.adversaries import features_of, train_zoo
from gradleak.utils.timing import rotated

DEFENSES = {
    "recupfl": {"epsilon": 0.001, "iterations": 10, "models": 5},
    "dp_gaussian": {"sigma": 0.01},
    "dp_laplace": {"scale": 0.01},
    "pruning": {"ratio": 0.2},
    "soteria": {"ratio": 0.1},
}


@dataclass(frozen=True)
class Shape:
    name: str
    images: Callable[[], data.ImageData]
    model: Callable[[], torch.nn.Module]
    attribute: str
    features: int


def shapes(args: argparse.Namespace) -> list[Shape]:
    chosen = [Shape("digits 1x16x16", lambda: data.load("digits", channels=1, size=16),
                    lambda: models.build("lenet", 1, 10, 16), "ink", args.feature_size)]
    if args.cifar:
        chosen.append(Shape("digits 3x32x32", lambda: data.load("digits", channels=3, size=32),
                            lambda: models.build("lenet", 3, 10, 32), "ink",
                            args.feature_size))
    if args.lfw:
        chosen.append(Shape("lfw 3x62x47", lambda: data.load("lfw", stand_in="digits"),
                            lambda: models.build("attribute_cnn", 3, 2, 62,
                                                 input_shape=(3, 62, 47), layout="lfw"),
                            "race", 1024))
    return chosen


def zoo_for(model: torch.nn.Module, images: data.ImageData, shape: Shape,
            args: argparse.Namespace):
    """The paper's zoo shape (20 models, widths 128 .. 2048) on the shape's features of
    the first 600 images, trained for ``--zoo-epochs``."""
    x, y = images.x[:600], images.y[:600]
    features = features_of(model, x, y, shape.features)
    labels = images.attributes[shape.attribute]
    return train_zoo(features, {shape.attribute: labels[:600]},
                     {shape.attribute: int(labels.max()) + 1}, size=args.zoo_size,
                     epochs=args.zoo_epochs, widths=(128, 2048), seed=0)


def time_shape(shape: Shape, args: argparse.Namespace) -> list[dict]:
    images = shape.images()
    torch.manual_seed(0)
    model = shape.model()
    zoo = zoo_for(model, images, shape, args)
    built = {name: defenses.build(name, **({"zoo": zoo} if name == "recupfl" else {}),
                                  **params) for name, params in DEFENSES.items()}
    rows = []
    for batch in args.batches:
        def defend(r: int, name: str, batch: int = batch) -> None:
            part = 600 + (r * batch + torch.arange(batch)) % (len(images) - 600)  # unseen
            attributes = {shape.attribute: images.attributes[shape.attribute][part]}
            built[name](defenses.DefenseContext(model, images.x[part], images.y[part],
                                                torch.Generator().manual_seed(r),
                                                attributes=attributes))

        # repeat 0 warms up (Soteria's scripted Jacobian); each repeat takes the next batch
        times = rotated({name: lambda r, n=name: defend(r, n) for name in built},
                        args.repeats, 1)
        rows += [{"shape": shape.name, "batch": batch, "defense": name, "repeat": r + 1,
                  "wall_s": wall, "cpu_s": cpu}
                 for name, runs in times.items() for r, (wall, cpu) in enumerate(runs)]
        done = pd.DataFrame(rows).query("batch == @batch")
        medians = done.groupby("defense", sort=False)["cpu_s"].median()
        print(f"{shape.name} batch {batch}, median CPU seconds: "
              + ", ".join(f"{name} {value:.4f}" for name, value in medians.items()), flush=True)
    return rows


def time_together(shape: Shape, args: argparse.Namespace) -> None:
    """Seconds per RecUP-FL upload made ``n`` at a time and one at a time, side by side."""
    images = shape.images()
    torch.manual_seed(0)
    model = shape.model()
    recupfl = defenses.build("recupfl", zoo=zoo_for(model, images, shape, args),
                             **DEFENSES["recupfl"])
    for n in args.together:
        def contexts(r: int, n: int = n) -> list[defenses.DefenseContext]:
            parts = 600 + (r * n + torch.arange(n)) % (len(images) - 600)
            return [defenses.DefenseContext(
                model, images.x[i:i + 1], images.y[i:i + 1], torch.Generator().manual_seed(i),
                attributes={shape.attribute: images.attributes[shape.attribute][i:i + 1]})
                for i in parts.tolist()]

        times = rotated({"together": lambda r: recupfl.many(contexts(r)),
                         "alone": lambda r: [recupfl(c) for c in contexts(r)]},
                        args.repeats, 1)
        median = {k: float(pd.Series([cpu for _, cpu in v]).median()) / n
                  for k, v in times.items()}
        print(f"{shape.name}: {n} uploads, median CPU seconds per upload: together "
              f"{median['together']:.4f}, alone {median['alone']:.4f} "
              f"({median['alone'] / median['together']:.2f}x)", flush=True)


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
    parser.add_argument("--lfw", action="store_true",
                        help="also Table 1's setting: LFW's CNN on 3x62x47 stand-in images")
    parser.add_argument("--feature-size", type=int, default=256)
    parser.add_argument("--zoo-size", type=int, default=20)
    parser.add_argument("--zoo-epochs", type=int, default=2)
    parser.add_argument("--together", nargs="+", type=int, default=[],
                        help="only time RecUP-FL's uploads made N at a time against one by one")
    parser.add_argument("--out", type=Path, help="CSV of every timing (and FILE_summary.csv)")
    args = parser.parse_args()
    if args.repeats < 1 or min(args.batches + args.together) < 1:
        parser.error("--repeats, --batches and --together must be at least 1")
    torch.set_num_threads(args.threads)
    if args.together:
        for shape in shapes(args):
            time_together(shape, args)
        return
    times = pd.DataFrame([row for shape in shapes(args) for row in time_shape(shape, args)])
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
