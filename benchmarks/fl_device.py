"""Seconds of one FL phase on each device: FedAvg (``fl.run_federated``, the code
``gradleak fl-run`` runs, the schema's ``fl:`` defaults otherwise) of LeNet on random
3x32x32 images in 10 classes, ``--clients`` iid clients all taking part every round with
one local step on a batch of ``--batch-size``, evaluated every 50 rounds on 512 test
images, the data put on the device once, the CPU with ``--threads`` torch threads (1: the
configuration's default ``threads``, one per job). Each device first runs 5 untimed
rounds (CUDA's start-up); the table has the seconds, the seconds per round and the
CPU / device ratio.

    python benchmarks/fl_device.py [--rounds 200] [--clients 10] [--batch-size 32]
        [--threads 1] [--devices cpu cuda] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gradleak import config, defenses, models
from gradleak.data.image_data import ImageData
from gradleak.data.splits import partition
from gradleak.fl import FLSettings, run_federated
from gradleak.utils.device import resolve, select
from gradleak.utils.io import write_text
from gradleak.utils.seeding import seed_everything

FL = config.validate_schema({})["fl"]  # the schema's defaults: server optimiser and learning rates


def fl_seconds(device: torch.device, rounds: int, clients: int, batch_size: int,
               threads: int) -> float:
    """Seconds of ``rounds`` FedAvg rounds on ``device`` (after a 5-round warm-up)."""
    generator = torch.Generator().manual_seed(0)
    train = ImageData(torch.rand(clients * 4 * batch_size, 3, 32, 32, generator=generator),
                      torch.randint(0, 10, (clients * 4 * batch_size,), generator=generator), 10)
    test = ImageData(torch.rand(512, 3, 32, 32, generator=generator),
                     torch.randint(0, 10, (512,), generator=generator), 10)
    shards = partition(train.y.numpy(), "iid", clients, np.random.default_rng(0))
    train, test = train.to(device), test.to(device)
    none = defenses.build("none")

    def run(count: int) -> float:
        seed_everything(0, threads)
        model = models.build("lenet", 3, 10, 32).to(device)
        settings = FLSettings.from_config({**FL, "rounds": count,
                                           "client_batch_size": batch_size, "local_steps": 1,
                                           "participation": 1.0, "eval_every": 50})
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run_federated(model, train, test, shards, none, settings, seed=0, progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    run(5)
    return run(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--devices", nargs="+", default=["cpu", "auto"],
                        help="cpu, cuda or auto (cuda where present, else the CPU once)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for device in dict.fromkeys(resolve(name) for name in args.devices):  # auto: once
        select(device.type)  # deterministic kernels, as a phase runs
        seconds = fl_seconds(device, args.rounds, args.clients, args.batch_size, args.threads)
        rows.append({"device": str(device), "rounds": args.rounds, "clients": args.clients,
                     "batch_size": args.batch_size, "threads": args.threads, "seconds": seconds,
                     "seconds_per_round": seconds / args.rounds})
        print(f"FL {args.rounds} rounds x {args.clients} clients on {device}: "
              f"{seconds:.2f} s ({1000 * seconds / args.rounds:.1f} ms/round)", flush=True)
    table = pd.DataFrame(rows)
    cpu = table.loc[table["device"] == "cpu", "seconds"]
    table["cpu_over_device"] = float(cpu.iloc[0]) / table["seconds"] if len(cpu) else np.nan
    for row in table.itertuples():
        if row.device != "cpu":
            print(f"CPU / {row.device}: {row.cpu_over_device:.2f}x")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out:
        write_text(args.out, table.to_csv(index=False))


if __name__ == "__main__":
    main()
