"""Peak memory and time of Soteria's input Jacobian (Refiner Table 5's defense), the whole
batch in one vectorised pass against one sample at a time in chunks of features
(``feature_chunk``), each in a fresh process so that its peak is its own.

    python benchmarks/soteria_chunks.py [--model resnet18] [--batch 2] [--chunks none 64 256]
        [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from gradleak import defenses, models


def measure(model_name: str, batch: int, chunk: int | None, device: str) -> dict:
    """One Soteria upload on CIFAR-10-sized inputs: seconds, peak memory, the mask."""
    torch.manual_seed(0)
    model = models.build(model_name, channels=3, num_classes=10, image_size=32).to(device)
    x = torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(device)
    ctx = defenses.DefenseContext(model=model, x=x, y=torch.arange(batch, device=device) % 10)
    defense = defenses.build("soteria", ratio=0.1, feature_chunk=chunk)
    start = time.perf_counter()
    update = defense(ctx)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() / 2**30 if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    kept = (update[defenses.soteria.defended_layer(model)] != 0).any(0)
    return {"chunk": chunk, "seconds": seconds, "peak_gib": peak,
            "kept": int(kept.sum()), "mask": kept.int().tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--chunks", nargs="+", default=["none", "64", "256"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's chunk
    args = parser.parse_args()
    if args.one is not None:
        chunk = None if args.one == "none" else int(args.one)
        print(json.dumps(measure(args.model, args.batch, chunk, args.device)))
        return
    rows = []
    for chunk in args.chunks:
        child = subprocess.run([sys.executable, __file__, "--model", args.model, "--batch",
                                str(args.batch), "--device", args.device, "--one", chunk],
                               capture_output=True, text=True)
        if child.returncode:
            print(f"chunk {chunk}: failed ({child.stderr.strip().splitlines()[-1]})")
            continue
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
    masks = {json.dumps(r["mask"]) for r in rows}
    for r in rows:
        print(f"{args.model} batch {args.batch} chunk {r['chunk']}: {r['seconds']:.1f} s, "
              f"peak {r['peak_gib']:.2f} GiB, {r['kept']} features kept")
    print("same mask in every form" if len(masks) == 1 else "MASKS DIFFER")


if __name__ == "__main__":
    main()
