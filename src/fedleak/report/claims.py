"""Whether a paper's claims hold (issue 46): each ``claims:`` entry's quantity on its
target's results, with its 95 % bootstrap interval (``report.intervals``) and a verdict.

The quantity is a metric of the target's table (its statistic, and the table's ``over``)
over the units of the rows ``of`` names, pooled (a key left out or null: any value): the
victims for a victim metric, grouped by seed; one per FL run (point and seed) for an FL
metric (accuracy, PMM); the rows of an attribute or study target. With ``to``, it is ours
on ``of`` minus ours on ``of`` with ``to``'s keys changed (``by: ratio``: over), both sides
resampled independently. ``best: min|max`` with ``over`` first picks one row on each side,
the table's smallest or largest value among the rows that keep the bounds (as a
``reference:`` cell does); the interval is then that row's, given the pick.

Verdict: ``holds`` when the whole interval lies on ``expect``'s side of its number,
``fails`` when it lies wholly on the other side, else ``inconclusive`` (so is a claim
without an interval: fewer than two units, or rows that the run does not have).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from fedleak.report.intervals import SEED, STATISTICS, bounds, replicates
from fedleak.report.reference import matching, same
from fedleak.report.tables import FL_METRICS, SUCCESS_SSIM

VERDICTS = ("holds", "fails", "inconclusive")
JUDGED_COLUMNS = ["claim", "ours", "ci_low", "ci_high", "verdict", "victims", "seeds"]
CLAIM_COLUMNS = ["claim", "paper", "section", "statement", "paper_value", "ours", "ci_low",
                 "ci_high", "verdict", "data", "scale", "victims", "seeds", "expect",
                 "conditions"]
RUN_KEYS = ("case", "defense", "strength", "series", "seed")  # one FL run of a point


def verdict(low: float, high: float, expect: Mapping) -> str:
    """holds, fails or inconclusive: where the interval [low, high] lies against
    ``expect`` ({"<": b} or {">": b})."""
    (op, bound), = expect.items()
    if np.isnan(low) or np.isnan(high):
        return "inconclusive"
    if (high < bound) if op == "<" else (low > bound):
        return "holds"
    if (low >= bound) if op == "<" else (high <= bound):
        return "fails"
    return "inconclusive"


def _picked(table: pd.DataFrame, keys: list[str], where: dict, claim: Mapping) -> dict | None:
    """The key values that select a side's rows: ``where``'s (null: any), or with ``best``
    the one table row it picks (None: no row keeps the bounds)."""
    given = {k: v for k, v in where.items() if v is not None}
    if "best" not in claim:
        return given
    rows = matching(table, given)
    for column, bound in claim.get("over", {}).items():
        (op, b), = bound.items()
        rows = rows[rows[column] > b] if op == ">" else rows[rows[column] < b]
    rows = rows.dropna(subset=[claim["metric"]])
    if rows.empty:
        return None
    metric = rows[claim["metric"]]
    return rows.loc[metric.idxmax() if claim["best"] == "max" else metric.idxmin(),
                    keys].to_dict()


def _units(source: pd.DataFrame, where: dict, keys: list[str], metric: str, over: str
           ) -> pd.DataFrame:
    """The units a side reads: ``value`` (the metric's column, as its statistic counts it)
    and ``seed``."""
    column, _, stat = metric.partition(":")
    column = "ssim" if metric == "asr" else column
    rows = source[np.logical_and.reduce(
        [source[k].map(lambda v, w=w: same(v, w)).to_numpy(dtype=bool)
         for k, w in where.items()] or [np.ones(len(source), dtype=bool)])]
    if column in FL_METRICS:  # one unit per FL run, whatever the victims attacked there
        rows = rows.drop_duplicates([c for c in (*RUN_KEYS, *keys) if c in rows])
    values = rows[column].astype(float) if column in rows else pd.Series(np.nan, rows.index)
    if metric == "asr":
        values = (values > SUCCESS_SSIM).astype(float)
    elif over == "successes" and column not in FL_METRICS:
        values = values.where(rows["ssim"] > SUCCESS_SSIM)
    seeds = rows["seed"] if "seed" in rows else pd.Series(0, rows.index)
    return pd.DataFrame({"value": values.to_numpy(), "seed": seeds.to_numpy()})


def _side(units: pd.DataFrame, stat: str, seed: int) -> tuple[float, np.ndarray]:
    """The statistic over a side's units and its bootstrap replicates."""
    values = units["value"].to_numpy(dtype=float)
    point = float(STATISTICS[stat](values)) if np.isfinite(values).any() else np.nan
    return point, replicates(values, units["seed"].to_numpy(), stat, seed=seed)


def judge(claim: Mapping, spec: Mapping, table: pd.DataFrame, source: pd.DataFrame) -> dict:
    """One claim's row of ``JUDGED_COLUMNS`` from its target's ``table`` and the frame the
    table was aggregated from (``source``)."""
    keys = [*spec["rows"], *spec.get("columns", [])]
    stat = "asr" if claim["metric"] == "asr" else claim["metric"].partition(":")[2] or "mean"
    wheres = [claim["of"]] + ([{**claim["of"], **claim["to"]}] if "to" in claim else [])
    picked = [_picked(table, keys, where, claim) for where in wheres]
    if any(p is None for p in picked):
        return {"claim": claim["id"], "ours": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                "verdict": "inconclusive", "victims": 0, "seeds": 0}
    units = [_units(source, where, keys, claim["metric"], spec.get("over", "all"))
             for where in picked]
    sides = [_side(u, stat, SEED + i) for i, u in enumerate(units)]
    (ours, draws), measured = sides[0], [int(u["value"].notna().sum()) for u in units]
    if len(sides) == 2:
        (base, base_draws) = sides[1]
        with np.errstate(divide="ignore", invalid="ignore"):
            if claim["by"] == "ratio":
                ours, draws = ours / base if base else np.nan, draws / base_draws
            else:
                ours, draws = ours - base, draws - base_draws
        draws = np.where(np.isfinite(draws), draws, np.nan)
    low, high = bounds(draws, min(measured)) if np.isfinite(ours) else (np.nan, np.nan)
    return {"claim": claim["id"], "ours": ours, "ci_low": low, "ci_high": high,
            "verdict": verdict(low, high, claim["expect"]), "victims": sum(measured),
            "seeds": int(pd.concat([u["seed"] for u in units]).nunique())}


def judge_all(claims: list[Mapping], spec: Mapping, table: pd.DataFrame,
              source: pd.DataFrame) -> pd.DataFrame:
    """:func:`judge` for every claim, as a frame of ``JUDGED_COLUMNS``."""
    return pd.DataFrame([judge(c, spec, table, source) for c in claims], columns=JUDGED_COLUMNS)


def claims_table(claims: list[Mapping], judged: list[pd.DataFrame], paper: str,
                 data: Mapping[str, str], scale: str, conditions: str = "") -> pd.DataFrame:
    """``results/claims.csv``: each claim's words and the paper's value beside its row of
    the targets' ``judged`` frames, on which ``data`` (claim id -> paper or stand-in) at
    which ``scale``; ``expect``: the side the quantity lies on if the claim holds;
    ``conditions``: what the scale changes from the paper's configuration."""
    judged = pd.concat(judged, ignore_index=True) if judged else \
        pd.DataFrame(columns=JUDGED_COLUMNS)
    text = pd.DataFrame([{"claim": c["id"], "paper": paper, "section": c["section"],
                          "statement": c["statement"], "paper_value": c["paper"],
                          "data": data[c["id"]], "scale": scale,
                          "expect": " ".join(f"{op} {b:g}" for op, b in c["expect"].items()),
                          "conditions": conditions} for c in claims],
                        columns=["claim", "paper", "section", "statement", "paper_value",
                                 "data", "scale", "expect", "conditions"])
    merged = text.merge(judged, on="claim", how="left")
    merged["verdict"] = merged["verdict"].fillna("inconclusive")
    return merged[CLAIM_COLUMNS]


def summary_line(table: pd.DataFrame) -> str:
    """"3 hold, 1 fails, 2 inconclusive (of 6)"."""
    counts = table["verdict"].value_counts()
    words = {"holds": ("holds", "hold"), "fails": ("fails", "fail"),
             "inconclusive": ("inconclusive", "inconclusive")}
    parts = [f"{counts[v]} {words[v][int(counts[v] != 1)]}" for v in VERDICTS if counts.get(v)]
    return f"{', '.join(parts)} (of {len(table)})"
