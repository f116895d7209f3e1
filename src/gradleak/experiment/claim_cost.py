"""``gradleak estimate --by claim``: what deciding each claim costs (decision 0105), the jobs
its rows and the regime entries it needs would run alone, priced as ``gradleak estimate``
prices a target. At the reduced scale a claim over ``BUDGET`` CPU-hours does not fit the
scale: its configuration lists it in ``left_out`` with these hours, and it is untestable
there."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

from gradleak.experiment import claims, estimate
from gradleak.utils.metric_kinds import reads_fl

BUDGET = 6.0  # CPU-hours: a paper's reduced scale, 3 hours on a 2-core machine


def alone(config: dict, claim: dict) -> dict:
    """``config`` planning one claim: its rows and the regime entries it needs (at the
    reduced scale), else its target."""
    if config["scale"] != "reduced":
        narrowed = copy.copy(config)
        narrowed["targets"] = {claim["target"]: config["targets"][claim["target"]]}
        return narrowed
    regime = config["regime"]
    read = claims.attacks_read(config, claim)
    return {**config, "claims": [claim], "left_out": {}, "regime": {
        **regime, "reconstructs": [e for e in regime["reconstructs"] if set(e["attacks"]) & read],
        "learns": regime["learns"] if reads_fl(claim) else []}}


def rows(config: dict, results: Path = estimate.RESULTS) -> list[dict]:
    """One row per claim (its ``target`` column the claim's id) and the ``total``."""
    found = {c["id"]: estimate.jobs(alone(config, c), results) for c in config["claims"]}
    found["total"] = estimate.jobs(config, results)
    units = {unit for jobs in found.values() for job in jobs.values() for unit in job.work}
    rates = estimate.calibrate(units, "cpu", config["threads"])
    out = []
    for name, jobs in found.items():
        work = sum((job.work for job in jobs.values()), Counter())
        out.append({"target": name, "jobs": len(jobs), "gpu_hours": None,
                    "cpu_hours": estimate.job_hours(work, rates),
                    "rules": Counter(job.rule for job in jobs.values())})
    return out


def text(rows_: list[dict], scale: str) -> str:
    """The estimate's text, with the claims over the reduced scale's budget named."""
    over = [r["target"] for r in rows_[:-1] if r["cpu_hours"] > BUDGET]
    lines = [estimate.text(rows_).replace("a job that several targets need",
                                          "a job that several claims need")]
    if scale == "reduced" and over:
        lines.append(f"over the reduced scale's {BUDGET:g} CPU-hours alone (list them in "
                     f"reduced_overrides.left_out with their hours): {', '.join(over)}\n")
    return "".join(lines)

