"""Iterations per second of Inverting Gradients: vectorised engine vs the per-victim loop.

Inverting Gradients (Geiping et al., NeurIPS 2020, Eq. 4) on LeNet and ResNet-18
(fedleak.models.build, 3x32x32 inputs, 10 classes) for 1, 8 and 32 problems
(victims x restarts), on the CPU and on CUDA when present. The per-victim loop
is what ``fedleak attack`` did per victim: ``build(seed=base + v)(obs)``; the
vectorised path is ``reconstruct_many`` on all victims at once (torch.func vmap).
An iteration is one Adam step of one problem, so iterations/s = problems x
iterations / seconds. After a warm-up, ``--repeats`` timed runs alternate the
order of the two paths so that machine noise hits both; medians are reported,
with process CPU time beside wall time on the CPU (robust to other processes on
a shared machine).

BatchNorm (ResNet-18): the models stay in training mode, as the client computed
the observed gradient; the per-victim path then normalises with each batch's own
statistics, and the vectorised path does the same on a copy of the model passed
through ``torch.func.replace_all_batch_norm_modules_`` (batch statistics, no
running-statistics update, which vmap cannot do in place).

    python benchmarks/attack_throughput.py --threads 1 [--models lenet resnet18]
        [--sizes 1 8 32] [--iterations lenet=20 resnet18=2] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from fedleak import attacks, models
from fedleak.types import Update

DEFAULT_ITERATIONS = {"lenet": 20, "resnet18": 2}


def iterations_per_model(spec: str) -> tuple[str, int]:
    """Parse ``MODEL=N`` (e.g. ``resnet18=2``)."""
    name, sep, count = spec.partition("=")
    if not sep or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected MODEL=N with N >= 1, got {spec!r}")
    return name, int(count)


def observations(model: torch.nn.Module, victims: int, batch: int, device: torch.device,
                 seed: int) -> list[attacks.Observation]:
    """``victims`` client updates of random images (uniform in [0, 1]) and labels."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(victims):
        x = torch.rand(batch, *model.input_shape, generator=gen).to(device)
        y = torch.randint(0, 10, (batch,), generator=gen).to(device)
        observed = Update.of(model, x, y).detached()
        out.append(attacks.Observation(model=model, gradient=observed, batch_size=batch,
                                       labels=y))
    return out


def per_victim(observed: list[attacks.Observation], params: dict) -> None:
    for v, obs in enumerate(observed):
        attacks.build("inverting_gradients", seed=v, **params)(obs)


def vectorised(observed: list[attacks.Observation], params: dict) -> None:
    attacks.build("inverting_gradients", seed=0, **params).reconstruct_many(observed)


def timed(run, observed: list[attacks.Observation], params: dict,
          device: torch.device) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one run."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    run(observed, params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(observed: list[attacks.Observation], params: dict, device: torch.device,
            repeats: int) -> dict[str, list[tuple[float, float]]]:
    """Interleaved timings of both paths after a one-iteration warm-up run of each."""
    warm = {**params, "iterations": 1}
    per_victim(observed, warm)
    vectorised(observed, warm)
    times: dict[str, list[tuple[float, float]]] = {"loop": [], "vectorised": []}
    for r in range(repeats):
        order = ("loop", "vectorised") if r % 2 == 0 else ("vectorised", "loop")
        for path in order:
            run = per_victim if path == "loop" else vectorised
            times[path].append(timed(run, observed, params, device))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lenet", "resnet18"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 8, 32],
                        help="problems = victims x restarts")
    parser.add_argument("--restarts", type=int, default=1, help="restarts per victim")
    parser.add_argument("--iterations", nargs="+", type=iterations_per_model, default=[],
                        help=f"MODEL=N Adam steps per run (default {DEFAULT_ITERATIONS})")
    parser.add_argument("--batch", type=int, default=1, help="images per client update")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/attack_throughput.csv"))
    args = parser.parse_args()
    bad = [s for s in args.sizes if s < 1 or s % args.restarts]
    if args.restarts < 1 or bad:
        raise SystemExit(f"sizes must be positive multiples of --restarts {args.restarts}; "
                         f"got {bad or args.restarts}")
    iterations = {**DEFAULT_ITERATIONS, **dict(args.iterations)}
    missing = sorted(set(args.models) - set(iterations))
    if missing:
        raise SystemExit(f"no iteration count for {missing}: pass --iterations MODEL=N")
    torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        for name in args.models:
            torch.manual_seed(0)
            model = models.build(name, 3, 10, 32).to(device)
            params = {"iterations": iterations[name], "restarts": args.restarts}
            for size in args.sizes:
                victims = size // args.restarts
                observed = observations(model, victims, args.batch, device, seed=size)
                times = measure(observed, params, device, args.repeats)
                row = {"device": device.type, "model": name, "problems": size,
                       "victims": victims, "restarts": args.restarts, "batch": args.batch,
                       "iterations": params["iterations"], "threads": args.threads}
                for path, runs in times.items():
                    wall = statistics.median(w for w, _ in runs)
                    row[f"{path}_seconds"] = wall
                    row[f"{path}_iterations_per_s"] = size * params["iterations"] / wall
                    row[f"{path}_cpu_seconds"] = statistics.median(c for _, c in runs)
                row["speedup"] = row["loop_seconds"] / row["vectorised_seconds"]
                row["cpu_speedup"] = row["loop_cpu_seconds"] / row["vectorised_cpu_seconds"]
                rows.append(row)
                print(f"{device.type:4} {name:8} {size:3} problems: loop "
                      f"{row['loop_iterations_per_s']:8.2f} it/s, vectorised "
                      f"{row['vectorised_iterations_per_s']:8.2f} it/s, ratio "
                      f"{row['speedup']:.2f} (CPU time {row['cpu_speedup']:.2f})", flush=True)
    table = pd.DataFrame(rows).sort_values(["device", "model", "problems"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g", lineterminator="\n")
    print(table[["device", "model", "problems", "loop_iterations_per_s",
                 "vectorised_iterations_per_s", "speedup", "cpu_speedup"]].to_string(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
