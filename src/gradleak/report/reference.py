"""The paper's numbers beside ours (a target's ``reference:``), each of its kind.

A reference row's metric cell is one of:

- a number: the paper's value (null: the paper gives none for that row);
- ``{"<": b}`` or ``{">": b}``: a bound the paper states ("below 30 %");
- ``{ratio: r, to: {key: value}}``: our value over ours on the baseline row, the row with
  those keys changed (RecUP-FL Figs. 6, 13: "8.2 times DP's MSE");
- ``{reduction: r, from: {key: value}}``: 1 - our value over ours on the baseline row
  ("reduces the ASR by 33.18 %": r = 0.3318);
- ``{difference: d, to: {key: value}}``: our value minus ours on the baseline row.

A cell (``{value: v}`` for a plain value) may also pick its row among several:
``best: max | min`` with ``over: {column: {">": b}}`` takes the largest or smallest value
over the rows with the row's keys (a null key: any) that keep every bound (Refiner Fig.
10: "about 30 % noise with negligible impact on the model's performance", the largest
noise ratio over the strengths that keep PMM above 99 %); a baseline row is picked alike.

Ours is computed the same way before the two are set side by side. The difference is
ours minus the paper's, and for a bound 0 where ours keeps it, else how far it misses.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import pandas as pd

from gradleak.utils.keys import same

BOUNDS = ("<", ">")


def kind(cell) -> str:
    """value, <, >, ratio, reduction or difference."""
    if not isinstance(cell, Mapping):
        return "value"
    return next(k for k in ("value", *BOUNDS, "ratio", "reduction", "difference") if k in cell)


def number(cell) -> float:
    """The paper's number in ``cell``, whatever its kind (NaN: the paper gives none)."""
    value = cell[kind(cell)] if isinstance(cell, Mapping) else cell
    return np.nan if value is None else float(value)


def baseline(cell) -> dict:
    """The keys that name a ratio's or a reduction's baseline row ({} otherwise)."""
    return dict(cell.get("to") or cell.get("from") or {}) if isinstance(cell, Mapping) else {}


def matching(table: pd.DataFrame, where: Mapping) -> pd.DataFrame:
    """The rows of ``table`` with these key values."""
    return table[np.logical_and.reduce([table[k].map(lambda v, r=value: same(v, r))
                                        for k, value in where.items()])] if where else table


def _row(table: pd.DataFrame, where: Mapping) -> pd.Series | None:
    """The one row of ``table`` with these key values (None: none, or several)."""
    match = matching(table, where)
    return match.iloc[0] if len(match) == 1 else None


def _value(table: pd.DataFrame, where: dict, metric: str, cell) -> float:
    """Our value of ``metric`` on the row ``where`` names, or, for a cell with ``best``,
    the largest or smallest over the rows with those keys (null: any) that keep ``over``."""
    if metric not in table:
        return np.nan
    if not (isinstance(cell, Mapping) and "best" in cell):
        row = _row(table, where)
        return float(row[metric]) if row is not None else np.nan
    rows = matching(table, {k: v for k, v in where.items() if not pd.isna(v)})
    for column, bound in cell.get("over", {}).items():
        (op, b), = bound.items()
        rows = rows[rows[column] > b] if op == ">" else rows[rows[column] < b]
    values = rows[metric].dropna()
    return float(values.max() if cell["best"] == "max" else values.min()) \
        if len(values) else np.nan


def _ours(table: pd.DataFrame, where: dict, metric: str, cell) -> float:
    """Our number for ``cell``: our value, or its ratio, reduction or difference against
    the baseline."""
    value = _value(table, where, metric, cell)
    if kind(cell) in ("ratio", "reduction", "difference"):
        base = _value(table, {**where, **baseline(cell)}, metric, cell)
        if kind(cell) == "difference":
            return value - base
        share = value / base if base else np.nan
        return share if kind(cell) == "ratio" else 1 - share
    return value


def _difference(cell, ours: float) -> float:
    paper = number(cell)
    if kind(cell) == "<":
        return 0.0 if ours < paper else ours - paper
    if kind(cell) == ">":
        return 0.0 if ours > paper else ours - paper
    return ours - paper


def _described(cell) -> str:
    if kind(cell) in BOUNDS:
        text = f"{kind(cell)} bound"
    elif kind(cell) == "value":
        text = "value"
    else:
        where = ", ".join(f"{k}={v}" for k, v in baseline(cell).items())
        text = f"{kind(cell)} {'from' if kind(cell) == 'reduction' else 'to'} {where}"
    if isinstance(cell, Mapping) and "best" in cell:
        over = ", ".join(f"{c} {op} {b}" for c, bound in cell.get("over", {}).items()
                         for op, b in bound.items())
        text += f", {cell['best']} over rows" + (f" with {over}" if over else "")
    return text


def compare(table: pd.DataFrame, keys: list[str], reference: dict
            ) -> tuple[pd.DataFrame, dict[str, str]]:
    """Our values beside the paper's for every reference row (``<metric>``, ``<metric>_paper``,
    ``<metric>_diff``, and ``<metric>_kind`` where a metric has cells of another kind than a
    value), and per metric how often the order of two rows agrees with the paper's (pairs
    of rows that differ only in the last key column; bounds are not ordered)."""
    paper = pd.DataFrame(reference["rows"], columns=reference["columns"])
    keys = [c for c in reference["columns"] if c in keys]
    metrics = [c for c in reference["columns"] if c not in keys]
    kinds = {m: any(isinstance(c, Mapping) for c in paper[m]) for m in metrics}
    rows = []
    for _, ref in paper.iterrows():
        where = {k: ref[k] for k in keys}
        row = dict(where)
        for metric in metrics:
            cell = ref[metric]
            ours = _ours(table, where, metric, cell)
            row.update({metric: ours, f"{metric}_paper": number(cell),
                        f"{metric}_diff": _difference(cell, ours)})
            if kinds[metric]:
                row[f"{metric}_kind"] = _described(cell)
        rows.append(row)
    comparison = pd.DataFrame(rows)
    agreement = {}
    groups = comparison.groupby(keys[:-1], sort=False) if len(keys) > 1 else [((), comparison)]
    for metric in metrics:
        agree = total = 0
        for _, group in groups:
            ordered = [r for _, r in group.iterrows()
                       if "bound" not in str(r.get(f"{metric}_kind", "value"))]
            for a, b in itertools.combinations(ordered, 2):
                paper_sign = np.sign(a[f"{metric}_paper"] - b[f"{metric}_paper"])
                ours_sign = np.sign(a[metric] - b[metric])
                if paper_sign != 0 and not np.isnan(paper_sign) and not np.isnan(ours_sign):
                    total += 1
                    agree += int(paper_sign == ours_sign)
        agreement[metric] = f"{agree}/{total}" if total else "-"
    return comparison, agreement


def paper_values(reference: dict | None, needed: list[str]) -> pd.DataFrame:
    """The paper's rows with the ``needed`` columns, values only (a figure draws them beside
    ours; empty where the reference gives none of them)."""
    if not reference or not set(needed) <= set(reference["columns"]):
        return pd.DataFrame(columns=needed)
    rows = pd.DataFrame(reference["rows"], columns=reference["columns"])[needed]
    plain = np.logical_and.reduce([rows[c].map(lambda v: not isinstance(v, Mapping))
                                   for c in needed])
    return rows[plain].reset_index(drop=True)
