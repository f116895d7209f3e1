"""`gradleak estimate` against a finished run: the CPU seconds the cost model gives each rule
beside the job wall seconds Snakemake recorded in ``results/benchmarks/`` (each rule's
``benchmark:`` file: wall seconds ``s`` and ``cpu_time``, which Snakemake samples every
second for a job's first 30 s, then every 30 s, so it misses up to that much of a job's
end), summed per rule and in total, and the estimate over each (issue 32: the total within
a factor of 2). Run the checked run with ``GRADLEAK_WARM=0``: under warm starts the benchmark
samples the job's command, not the child that does its work (gradleak.warm), and the
estimate prices each job's cold start-up. The estimate's CPU seconds are load-robust; wall
seconds on a machine shared with other work are not (``uptime`` beside the numbers).

The estimate is of the run's own resolved configuration (``results/config.resolved.json``,
smoke overrides and ``--config`` values included) and its prepared data's manifests (the
split sizes), with the calibration in ``$GRADLEAK_CACHE`` (measured now where it has no
entry: clear it right before the run so both see the same machine load).

    python benchmarks/estimate_check.py RUN_DIR [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pandas as pd

from gradleak.experiment import configuration, estimate
from gradleak.utils.io import write_text


def measured(results: Path) -> pd.DataFrame:
    """Per rule: the jobs with a benchmark file and their summed wall seconds."""
    rows = [{"rule": path.relative_to(results / "benchmarks").parts[0],
             "wall": float(record["s"]), "cpu": float(record["cpu_time"])}
            for path in sorted((results / "benchmarks").rglob("*.tsv"))
            for record in [pd.read_csv(path, sep="\t").iloc[-1]]]
    if not rows:
        raise SystemExit(f"{results / 'benchmarks'}: no benchmark files; expected a finished "
                         f"snakemake run")
    frame = pd.DataFrame(rows)
    return frame.groupby("rule").agg(jobs=("wall", "size"), wall=("wall", "sum"),
                                     cpu=("cpu", "sum"))


def estimated(results: Path) -> pd.DataFrame:
    """Per rule: the jobs the cost model counts and their estimated CPU seconds."""
    resolved = results / "config.resolved.json"
    if not resolved.is_file():
        raise SystemExit(f"{resolved}: missing; expected the results of a snakemake run")
    config = configuration.validate(json.loads(resolved.read_text()))
    found = estimate.plan_jobs(config, None, results)["total"]
    units = {unit for job in found.values() for unit in job.work}
    rates = estimate.calibrate(units, "cpu", config["threads"])
    jobs, seconds = Counter(), Counter()
    for job in found.values():
        jobs[job.rule] += 1
        seconds[job.rule] += 3600 * estimate.job_hours(job.work, rates)
    return pd.DataFrame({"jobs": jobs, "estimate": seconds}).rename_axis("rule")


def compare(run: Path) -> pd.DataFrame:
    """Per rule and in total: jobs measured and estimated, summed wall and CPU seconds of
    the benchmarks, the estimate's CPU seconds, and the estimate over each."""
    results = run / "results"
    table = measured(results).join(estimated(results).rename(columns={"jobs": "jobs_est"}),
                                   how="outer").fillna(0)
    table.loc["total"] = table.sum()
    table["est/wall"] = table["estimate"] / table["wall"]
    table["est/cpu"] = table["estimate"] / table["cpu"]
    return table.astype({"jobs": int, "jobs_est": int})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the project folder the run wrote results/ in")
    parser.add_argument("--out", type=Path, help="also write the table as CSV")
    args = parser.parse_args()
    table = compare(args.run)
    print(table.to_string(float_format=lambda v: f"{v:.3g}"))
    for column in ("est/wall", "est/cpu"):
        ratio = table.loc["total", column]
        print(f"total {column}: {ratio:.2f} "
              f"({'within' if 0.5 <= ratio <= 2 else 'outside'} a factor of 2)")
    if args.out:
        write_text(args.out, table.to_csv(float_format="%.6g"))


if __name__ == "__main__":
    main()
