"""Fan et al.'s gradient regularisation under its two readings (attacks/fan2025.py ``probe``)
and without it, on the same uploads, paired: the artifact's look-ahead (``descent``: the
second gradient where the optimiser's step went), Zhao et al.'s gradient-norm penalty
(``ascent``: as far the other way) and a plain step (``lookahead: 0``).

Uploads as in tests/test_fan2025.py's comparison with Inverting Gradients: scikit-learn's
digits at 16x16, a fresh Sigmoid LeNet per client (seeded by its index), labels known;
FedSGD one gradient of 16 images, FedAvg 5 local SGD steps at lr 0.03 on 4. The attack at
the embedded default's budget (200 iterations, the generator 32 channels wide, no median
filter). Per victim the mean PSNR over its images; paired differences with the package's
95 % interval.

    python benchmarks/fan2025_probe.py [--protocol fedsgd|fedavg] [--victims 8]
        [--iterations 200] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from gradleak import attacks, metrics
from gradleak.attacks import Observation
from gradleak.attacks.engine import reconstruct_all
from gradleak.data import load_digits
from gradleak.fl.client import local_update
from gradleak.models import LeNet
from gradleak.report.intervals import interval
from gradleak.types import Update
from gradleak.utils.io import write_text

READINGS = {"descent": {"probe": "descent"}, "ascent": {"probe": "ascent"},
            "plain": {"lookahead": 0.0}}
BATCH = {"fedsgd": 16, "fedavg": 4}


def uploads(protocol: str, victims: int) -> list[tuple[Observation, torch.Tensor]]:
    """Each victim's upload and its images (the test's draw, ``victims`` of them)."""
    digits = load_digits(channels=1)
    x = F.interpolate(digits.x, size=(16, 16), mode="bilinear", antialias=True,
                      align_corners=False).clamp(0, 1)
    rng, batch = np.random.default_rng(11), BATCH[protocol]
    out = []
    for v in range(victims):
        idx = rng.choice(len(x), batch, replace=False)
        images, labels = x[idx], digits.y[idx]
        torch.manual_seed(v)
        model = LeNet(1, 10, 16)
        if protocol == "fedsgd":
            obs = Observation(model=model, gradient=Update.of(model, images, labels),
                              batch_size=batch, labels=labels)
        else:
            obs = Observation(model=model, gradient=local_update(
                model, lambda _step, x=images, y=labels: (x, y), 5, 0.03), batch_size=batch,
                labels=labels, local_steps=5, local_lr=0.03)
        out.append((obs, images))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=sorted(BATCH), default="fedsgd")
    parser.add_argument("--victims", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write each victim's PSNR as CSV")
    args = parser.parse_args()
    torch.set_num_threads(1)
    found = uploads(args.protocol, args.victims)
    observations = [obs for obs, _ in found]
    psnr = {}
    for name, option in READINGS.items():
        attack = attacks.build("fan2025", iterations=args.iterations, channels=32,
                               median_filter=1, **option)
        out = reconstruct_all(attack, observations)
        psnr[name] = [float(metrics.psnr(r.images.clamp(0, 1), x))
                      for r, (_, x) in zip(out, found)]
        print(f"{name}: {np.mean(psnr[name]):.2f} dB", flush=True)
    table = pd.DataFrame(psnr).rename_axis("victim")
    for a, b in (("ascent", "descent"), ("descent", "plain"), ("ascent", "plain")):
        gain = table[a] - table[b]
        low, high = interval(gain.to_numpy())
        print(f"{a} - {b}: {gain.mean():+.2f} [{low:+.2f}, {high:+.2f}]")
    if args.out:
        write_text(args.out, table.to_csv(float_format="%.4f"))


if __name__ == "__main__":
    main()
