"""Time saved by EPAFL's early stopping (Tabassum et al., §4.2, Alg. 1-2, Table 5).

DLG, iDLG (300 L-BFGS iterations, lr 1) and iDLG with EPAFL's hybrid stopper
(threshold 1e-5, patience 15) reconstruct the same victims, one MNIST test image each
(or the bundled digits at 28x28 with ``--digits``), from an untrained LeNet with DLG's
U(-0.5, 0.5) init. The three attacks alternate victim by victim so that machine noise
hits them alike; process CPU time is reported beside wall time (robust to other
processes on a shared machine), with each attack's ratio to iDLG.

    python benchmarks/early_stopping.py [--mnist-root ../shared/datasets] [--victims 10]
        [--threads 1] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gradleak import attacks, data, defenses, metrics, models
from gradleak.utils.seeding import seed_everything

ATTACKS = {
    "DLG": ("dlg", {"iterations": 300}),
    "iDLG": ("idlg", {"iterations": 300}),
    "EPAFL": ("idlg", {"iterations": 300,
                       "stopper": {"kind": "hybrid", "threshold": 1e-5, "patience": 15}}),
}


def victims(args: argparse.Namespace) -> data.ImageData:
    if args.digits:
        return data.load_digits(channels=1, size=28)
    return data.load_mnist(args.mnist_root, split="test")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mnist-root", default="../shared/datasets")
    parser.add_argument("--digits", action="store_true", help="the bundled digits instead")
    parser.add_argument("--victims", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.victims < 1:
        parser.error(f"--victims must be at least 1, got {args.victims}")
    torch.set_num_threads(args.threads)
    images = victims(args)
    picked = np.random.default_rng(0).choice(len(images), args.victims, replace=False)
    rows = []
    for v, index in enumerate(picked):
        x, y = images.x[index:index + 1], images.y[index:index + 1]
        seed_everything(v)
        model = models.build("lenet", channels=1, num_classes=10, image_size=x.shape[-1],
                             uniform_init=True)
        ctx = defenses.DefenseContext(model=model, x=x, y=y, rng=torch.Generator())
        observation = attacks.Observation(model=model, gradient=ctx.true_gradient(),
                                          batch_size=1, labels=None)
        for label, (name, params) in ATTACKS.items():
            seed_everything(v)
            wall, cpu = time.perf_counter(), time.process_time()
            rec = attacks.build(name, **params)(observation)
            rows.append({"attack": label, "victim": v, "iterations": rec.iterations,
                         "wall_s": time.perf_counter() - wall,
                         "cpu_s": time.process_time() - cpu,
                         "ssim": float(metrics.ssim(rec.images, x))})
        print(" ".join(f"{r['attack']} {r['iterations']} it {r['cpu_s']:.1f} s"
                       for r in rows[-len(ATTACKS):]), f"(victim {v + 1}/{args.victims})")
    df = pd.DataFrame(rows)
    summary = df.groupby("attack", sort=False).agg(
        victims=("victim", "size"), asr=("ssim", lambda s: float((s > 0.9).mean())),
        iterations=("iterations", "mean"), wall_s=("wall_s", "sum"), cpu_s=("cpu_s", "sum"))
    summary["cpu_vs_idlg"] = summary["cpu_s"] / summary.loc["iDLG", "cpu_s"]
    summary["iterations_vs_idlg"] = summary["iterations"] / summary.loc["iDLG", "iterations"]
    print(summary.round(3).to_string())
    if args.out:
        summary.to_csv(args.out)


if __name__ == "__main__":
    main()
