"""Seconds per client update for every defense (Refiner Table 5 shape).

One client update = the defended upload of one batch (default 32 CIFAR-sized
images, 3x32x32) on LeNet, ResNet-10 and ResNet-18, on the CPU and on CUDA when
present. Every defense is timed ``--repeats`` times side by side, the order rotated
each repeat after one warm-up (``gradleak.utils.timing.rotated``, as the pipeline's
``defense_cost`` study, Refiner Table 5's target, times them); the table reports
medians and the ratio to ``none``.
A second table times Soteria's vectorised Jacobian against the per-feature loop
(one backward pass per feature) on LeNet for several batch sizes, image sizes and
channel counts (1 channel takes the forward-mode Jacobian, 3 the reverse mode).

    python benchmarks/defense_cost.py [--models lenet resnet10 resnet18] [--out FILE.csv]
        [--soteria-batches 1 8 32] [--soteria-sizes 16 32] [--soteria-channels 1 3]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd
import torch

from gradleak import defenses
from gradleak.experiment.studies.defense_cost import build_model, untrained_evalnet
from gradleak.utils.timing import rotated

SETTINGS = {
    "none": {}, "dp_gaussian": {"sigma": 0.01}, "dp_laplace": {"scale": 0.01},
    "quantization": {"bits": 4}, "pruning": {"ratio": 0.5}, "clipping": {"bound": 4.0},
    "soteria": {"ratio": 0.1},
    "censor": {"trials": 20}, "refiner": {"epsilon": 0.1},
}


def soteria_speedup(device: torch.device, batches: list[int], sizes: list[int],
                    channel_counts: list[int], repeats: int) -> list[dict]:
    """Soteria's score pass on LeNet: per-feature loop vs vectorised, interleaved."""
    from itertools import product

    from gradleak.defenses.soteria import feature_scores, feature_scores_loop

    rows = []
    for channels, size in product(channel_counts, sizes):
        model = build_model("lenet", (channels, size, size), 10, "lfw", 0).to(device)
        for batch in batches:
            x = torch.rand(batch, channels, size, size, device=device)
            times = rotated({"loop": lambda _r, m=model, x=x: feature_scores_loop(m, x),
                             "vectorised": lambda _r, m=model, x=x: feature_scores(m, x)},
                            repeats, 1, device)
            loop, fast = (statistics.median(w for w, _ in times[k]) for k in ("loop", "vectorised"))
            rows.append({"device": device.type, "channels": channels, "image_size": size,
                         "batch": batch, "loop_seconds": loop, "vectorised_seconds": fast,
                         "speedup": loop / fast})
            print(f"Soteria {device.type} LeNet {channels}x{size}x{size} batch {batch}: "
                  f"loop {loop:.4f} s, vectorised {fast:.4f} s, {loop / fast:.1f}x", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lenet", "resnet10", "resnet18"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/defense_cost.csv"))
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(SETTINGS),
                        help="defenses not to time (e.g. soteria on ResNets on a CPU)")
    parser.add_argument("--soteria-batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--soteria-sizes", nargs="+", type=int, default=[16, 32])
    parser.add_argument("--soteria-channels", nargs="+", type=int, default=[1, 3])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    rows = []
    labels = ["none", *(k for k in SETTINGS if k not in args.skip and k != "none")]
    for device in devices:
        for name in args.models:
            model = build_model(name, (3, 32, 32), 10, "lfw", 0).to(device)
            x = torch.rand(args.batch, 3, 32, 32, device=device)
            y = torch.randint(0, 10, (args.batch,), device=device)
            evalnet = untrained_evalnet((3, 32, 32), [128, 256, 512], "refiner").to(device)
            built = {label: defenses.build(label, **SETTINGS[label], **(
                {"evalnet": evalnet} if label == "refiner" else {})) for label in labels}
            times = rotated({label: lambda r, d=defense, m=model, x=x, y=y: d(
                defenses.DefenseContext(m, x, y, generator=torch.Generator().manual_seed(r)))
                for label, defense in built.items()}, args.repeats, 1, device)
            medians = {label: statistics.median(w for w, _ in v) for label, v in times.items()}
            for label in labels:
                rows.append({"device": device.type, "model": name, "defense": label,
                             "seconds": medians[label], "none_seconds": medians["none"]})
                print(f"{device.type:4} {name:9} {label:13} {medians[label]:.4f} s", flush=True)
    table = pd.DataFrame(rows)
    table["ratio_to_none"] = table["seconds"] / table["none_seconds"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g", lineterminator="\n")
    wide = table.pivot_table(index="defense", columns=["device", "model"], values="ratio_to_none")
    print("\nseconds per update / none:\n" + wide.round(2).to_string())
    speedups = pd.DataFrame([row for device in devices for row in soteria_speedup(
        device, args.soteria_batches, args.soteria_sizes, args.soteria_channels,
        args.repeats)])
    speedups.to_csv(args.out.with_name(args.out.stem + "_soteria.csv"), index=False,
                    float_format="%.6g", lineterminator="\n")
    print("\nSoteria loop / vectorised:\n"
          + speedups.pivot_table(index=["device", "channels", "image_size"], columns="batch",
                                 values="speedup").round(1).to_string())


if __name__ == "__main__":
    main()
