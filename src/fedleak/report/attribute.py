"""RecUP-FL's attribute-inference results as tables and the privacy-utility figure.

- ``attribute.csv``: one row per (case, defense, strength, adversary, attribute, round,
  seed): ASR, chance, learning loss (the FL run's final test loss) and accuracy (the
  defense's time per upload stays in the job's metrics.json: tables are byte-identical
  from run to run, timings are not).
- ``attribute_gap.csv``: RecUP-FL against the best baseline at matched learning loss
  (Cui et al. §6.1-6.2): at each RecUP-FL setting's learning loss, every other defense's
  ASR interpolated linearly on its own (learning loss, ASR) curve, which starts from the
  undefended run, where that curve spans the loss; ``gap`` = RecUP-FL's ASR minus the
  lowest of them (negative: RecUP-FL wins).
- ``attribute_tradeoff.png``: ASR against learning loss, one curve per defense, one panel
  per adversary x round (Fig. 2/10/11).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fedleak.report.tables import load_record, require, write_csv

ATTRIBUTE_COLUMNS = ["case", "defense", "strength", "adversary", "attribute", "round", "seed",
                     "asr", "chance", "learning_loss", "accuracy"]
ATTRIBUTE_KEYS = ["case", "adversary", "attribute", "round"]
GAP_COLUMNS = [*ATTRIBUTE_KEYS, "strength", "learning_loss", "asr", "baseline",
               "baseline_asr", "gap"]
DEFENDED = "recupfl"


def attribute_table(files: list[Path]) -> pd.DataFrame:
    """One row per (attribute job, adversary, attribute, round)."""
    rows = []
    for path in files:
        job = load_record(path, ["case", "defense", "strength", "seed", "rows",
                                 "learning_loss", "accuracy"])
        for i, row in enumerate(job["rows"]):
            require(row, ["adversary", "attribute", "round", "asr", "chance"], path,
                    where=f" in rows[{i}]")
            rows.append({**{k: job[k] for k in ("case", "defense", "strength", "seed",
                                                "learning_loss", "accuracy")},
                         **{k: row[k] for k in ("adversary", "attribute", "round", "asr",
                                                "chance")}})
    df = pd.DataFrame.from_records(rows, columns=ATTRIBUTE_COLUMNS)
    df["strength"] = df["strength"].astype(float)
    order = ["case", "defense", "strength", "adversary", "attribute", "round", "seed"]
    return df.sort_values(order, kind="stable").reset_index(drop=True)


def _curve(points: pd.DataFrame, y: str = "asr", by: str = "strength"
           ) -> tuple[np.ndarray, np.ndarray]:
    """A defense's (learning loss, ASR) points, one per ``by`` value (mean over seeds),
    sorted by loss."""
    mean = points.groupby(by)[["learning_loss", y]].mean().sort_values(
        "learning_loss", kind="stable")
    return mean["learning_loss"].to_numpy(), mean[y].to_numpy()


def attribute_gap(table: pd.DataFrame, defended: str = DEFENDED) -> pd.DataFrame:
    """RecUP-FL's ASR beside the best other defense's at the same learning loss. Every
    curve starts from the undefended run (strength 0 of any defense is no defense)."""
    rows = []
    for keys, group in table.groupby(ATTRIBUTE_KEYS, sort=True):
        ours = group[group["defense"] == defended]
        undefended = group[group["defense"] == "none"]
        others = {d: _curve(pd.concat([undefended, g]))
                  for d, g in group[~group["defense"].isin([defended, "none"])].groupby(
                      "defense")}
        for strength, point in ours.groupby("strength"):
            loss, asr = point["learning_loss"].mean(), point["asr"].mean()
            matched = {d: float(np.interp(loss, x, y)) for d, (x, y) in others.items()
                       if len(x) and x[0] <= loss <= x[-1]}
            best = min(matched, key=matched.get) if matched else None
            rows.append({**dict(zip(ATTRIBUTE_KEYS, keys)), "strength": strength,
                         "learning_loss": loss, "asr": asr, "baseline": best,
                         "baseline_asr": matched.get(best, np.nan),
                         "gap": asr - matched[best] if best else np.nan})
    return pd.DataFrame.from_records(rows, columns=GAP_COLUMNS)


def attribute_tradeoff(table: pd.DataFrame, *, y: str = "asr", hue: str = "defense",
                       panels: str = "adversary", by: str = "strength",
                       title: str = "Attribute inference: ASR against learning loss "
                                    "(dotted: chance)") -> Figure:
    """ASR (column ``y``) against learning loss, one curve per ``hue`` value whose points are
    its ``by`` values (mean over seeds); panels: ``panels`` (columns) x round (rows); the
    dotted line is the panel's mean chance (the majority class's share)."""
    columns = sorted(table[panels].unique(), key=str)
    rounds = sorted(table["round"].unique())
    curves = sorted(table[hue].unique(), key=str)
    cycle = plt.get_cmap("tab10").colors
    colors = {value: cycle[i % len(cycle)] for i, value in enumerate(curves)}
    fig, axes = plt.subplots(max(1, len(rounds)), max(1, len(columns)), squeeze=False,
                             sharey=True, layout="constrained",
                             figsize=(3.2 * len(columns) + 1.5, 2.8 * max(1, len(rounds))))
    for (r, round_), (c, column) in ((a, b) for a in enumerate(rounds)
                                     for b in enumerate(columns)):
        ax = axes[r][c]
        panel = table[(table[panels] == column) & (table["round"] == round_)]
        for value in curves:
            points = panel[panel[hue] == value]
            if points.empty:
                continue
            x, v = _curve(points, y, by)
            ax.plot(x, v, marker="o", ms=3, label=str(value), color=colors[value],
                    linestyle="none" if value == "none" else "-")
        ax.axhline(panel["chance"].mean(), color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"{column}, round {round_}", fontsize=9)
        ax.set_xlabel("learning loss")
        ax.locator_params(axis="x", nbins=4)  # losses close together: few, readable ticks
        if c == 0:
            ax.set_ylabel("ASR")
    if table.empty:
        axes[0][0].text(0.5, 0.5, "no attribute results", ha="center", va="center")
    legend = {}  # every curve once, in the order of ``curves``, from any panel
    for ax in axes.flat:
        legend.update({label: h for h, label in zip(*ax.get_legend_handles_labels())
                       if label not in legend})
    if legend:
        order = [str(v) for v in curves if str(v) in legend]
        fig.legend([legend[k] for k in order], order, loc="outside right center", fontsize=8)
    fig.suptitle(title)
    return fig


def write_attribute_tables(files: list[Path], out_dir: Path) -> dict[str, pd.DataFrame]:
    """``attribute.csv`` and ``attribute_gap.csv`` in ``out_dir``; returns both tables."""
    table = attribute_table(files)
    tables = {"attribute": table, "attribute_gap": attribute_gap(table)}
    for name, df in tables.items():
        write_csv(df, Path(out_dir) / f"{name}.csv")
    return tables
