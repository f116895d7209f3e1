"""The claims a paper's reduced scale leaves out for their price (``reduced_overrides.
left_out``, decision 0105), run on a GPU machine within a budget, and their claims.csv.

1. Every left-out claim is priced alone on this machine: ``gradleak estimate --by claim
   --format csv`` of the reduced scale with nothing left out (GPU-hours where CUDA is
   there, else CPU-hours over ``--cores``); a claim left out for its data (a reason
   starting with one of ``DATA_REASONS``), not its price, stays out.
2. The cheapest claims are kept while their summed price fits ``--minutes`` (a job two
   claims share is priced in both: the sum over-counts, never under).
3. The configuration with only the others left out is written beside the results, and
   ``snakemake --cores N --configfile it --config scale=reduced device=auto`` runs it; the
   claims.csv, regime.csv and report.md are copied to ``--out`` ($OUT on the device
   machine), marked with the device in device.json.

    python benchmarks/device_claims.py config/paper/refiner.yaml [--minutes 8] [--cores 16]
        [--out DIR] [--model resnet18] [--dry-run]

``--dry-run`` prices and chooses and prints the command without running it. ``--model``
runs the reduced scale's LeNet cases on another model (CENSOR's claims on Inverting Gradients and
GradInversion, left out because neither reconstructs on the stand-ins' LeNet, on the
paper's ResNet-18), priced on it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch
import yaml

DATA_REASONS = ("the stand-in",)  # a left-out reason starting so is about data, not price


def read(config: Path, model: str | None = None) -> dict:
    """The configuration, its paper's numbers (``reference.<t>.file``) named by absolute
    paths, so that a copy written elsewhere still finds them; with ``model``, the reduced
    scale's LeNet cases (the stand-in for a paper's larger model) on that model."""
    raw = yaml.safe_load(config.read_text())
    for entry in raw.get("reference", {}).values():
        if isinstance(entry, dict) and "file" in entry:
            entry["file"] = str((config.parent / entry["file"]).resolve())
    if model:
        cases = raw["reduced_overrides"].get("cases", raw.get("cases", []))
        raw["reduced_overrides"]["cases"] = [{**case, "model": model}
                                             if case["model"] == "lenet" else case
                                             for case in cases]
    return raw


def prices(raw: dict, work: Path) -> pd.DataFrame:
    """Claim id -> hours alone (GPU-hours on CUDA, else CPU-hours), nothing left out."""
    raw = {**raw, "reduced_overrides": {**raw["reduced_overrides"], "left_out": {}}}
    unpriced = work / "unpriced.yaml"
    unpriced.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = subprocess.run(["gradleak", "estimate", "--config", str(unpriced), "--scale",
                          "reduced", "--by", "claim", "--format", "csv"],
                         check=True, capture_output=True, text=True).stdout
    table = pd.read_csv(io.StringIO(out)).set_index("target")
    return table.drop(index="total")


def choose(left_out: dict, priced: pd.DataFrame, minutes: float, cores: int
           ) -> tuple[list[str], float]:
    """The cheapest left-out claims (by price) whose summed hours fit ``minutes``."""
    gpu = priced["gpu_hours"].notna().all()
    hours = priced["gpu_hours"] if gpu else priced["cpu_hours"] / cores
    candidates = sorted((hours[c], c) for c, why in left_out.items()
                        if c in hours and not why.startswith(DATA_REASONS))
    chosen, spent = [], 0.0
    for cost, claim in candidates:
        if spent + cost <= minutes / 60:
            chosen.append(claim)
            spent += cost
    return chosen, spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results-device")))
    parser.add_argument("--model", help="the reduced scale's cases on this model")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    raw = read(args.config, args.model)
    left_out = raw["reduced_overrides"].get("left_out", {})
    priced = prices(raw, args.out)
    chosen, hours = choose(left_out, priced, args.minutes, args.cores)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"{len(chosen)} of {len(left_out)} left-out claims fit {args.minutes:g} minutes on "
          f"{device} ({hours * 60:.1f} estimated): {', '.join(chosen) or 'none'}")
    raw["reduced_overrides"]["left_out"] = {c: w for c, w in left_out.items() if c not in chosen}
    derived = args.out / f"{args.config.stem}-device.yaml"
    derived.write_text(yaml.safe_dump(raw, sort_keys=False))
    command = ["snakemake", "--cores", str(args.cores), "--configfile", str(derived),
               "--config", "scale=reduced", "device=auto"]
    print(" ".join(command))
    if args.dry_run or not chosen:
        return 0
    status = subprocess.run(command).returncode
    for name in ("claims.csv", "regime.csv", "report.md"):
        if Path("results", name).is_file():
            shutil.copy(Path("results", name), args.out / name)
    (args.out / "device.json").write_text(json.dumps(
        {"device": device, "cores": args.cores, "claims": chosen, "status": status}, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
