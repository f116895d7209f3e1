"""RecUP-FL's attribute-inference results as tables and the privacy-utility figure.

- ``attribute.csv``: one row per (case, defense, strength, adversary, attacker, attribute,
  round, seed), ``attacker`` being ``paper`` (the adversary learnt from clean gradients,
  §5.4) or ``adaptive`` (it learnt from the setting's defended uploads, decision 0072): ASR,
  chance, learning loss (the FL run's final test loss) and accuracy (the defense's time
  per upload stays in the job's metrics.json: tables are byte-identical from run to run,
  timings are not).
- ``attribute_gap.csv``: RecUP-FL against the best baseline at matched learning loss
  (Cui et al. §6.1-6.2): at each RecUP-FL setting's learning loss, every other defense's
  ASR interpolated linearly on its own (learning loss, ASR) curve, which starts from the
  undefended run, where that curve spans the loss; ``gap`` = RecUP-FL's ASR minus the
  lowest of them (negative: RecUP-FL wins); per attacker (both sides the same one). Each
  ASR has its 95 % bootstrap interval over FL seeds (``report.intervals``; NaN with one
  seed), a baseline's interpolated from its two points' alike, and the gap's runs from
  RecUP-FL's low minus the baseline's high to its high minus the baseline's low: both
  wider than an interval of the interpolated or subtracted means themselves.
- ``attribute_tradeoff.png``: ASR against learning loss (log), one curve per defense, one
  panel per adversary x round (Fig. 2/10/11); the adaptive attacker's curves dashed.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gradleak.report.intervals import interval
from gradleak.report.matched_loss import at_loss
from gradleak.report.style import case_text, finish, label_points, log_axis, series_styles
from gradleak.report.tables import load_record, require, write_csv
from gradleak.settings import PAPER

ATTRIBUTE_COLUMNS = ["case", "defense", "strength", "adversary", "attacker", "attribute",
                     "round", "seed", "asr", "chance", "learning_loss", "accuracy"]
ATTRIBUTE_KEYS = ["case", "adversary", "attacker", "attribute", "round"]
GAP_COLUMNS = [*ATTRIBUTE_KEYS, "strength", "learning_loss", "asr", "asr_low", "asr_high",
               "baseline", "baseline_asr", "baseline_asr_low", "baseline_asr_high", "gap",
               "gap_low", "gap_high"]
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
                                                "chance")},
                         "attacker": row.get("attacker", PAPER)})
    df = pd.DataFrame.from_records(rows, columns=ATTRIBUTE_COLUMNS)
    df["strength"] = df["strength"].astype(float)
    order = ["case", "defense", "strength", "adversary", "attacker", "attribute", "round",
             "seed"]
    return df.sort_values(order, kind="stable").reset_index(drop=True)


def _curve(points: pd.DataFrame, y: str = "asr", by: str = "strength"
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A defense's (learning loss, ASR) points, one per ``by`` value (mean over seeds),
    sorted by loss, and their ``by`` values."""
    mean = points.groupby(by)[["learning_loss", y]].mean().sort_values(
        "learning_loss", kind="stable")
    return mean["learning_loss"].to_numpy(), mean[y].to_numpy(), mean.index.to_numpy()


def _asr_bounds(points: pd.DataFrame) -> pd.DataFrame:
    """Per strength: mean learning loss and the ASR's 95 % interval over seeds, by loss."""
    grouped = points.groupby("strength")
    return pd.DataFrame({
        "learning_loss": grouped["learning_loss"].mean(),
        "low": grouped["asr"].agg(lambda v: interval(v)[0]),
        "high": grouped["asr"].agg(lambda v: interval(v)[1])}).sort_values(
            "learning_loss", kind="stable")


def attribute_gap(table: pd.DataFrame, defended: str = DEFENDED) -> pd.DataFrame:
    """RecUP-FL's ASR beside the best other defense's at the same learning loss, under the
    same attacker. Every curve starts from the undefended run (strength 0 of any defense is
    no defense)."""
    rows = []
    for keys, group in table.groupby(ATTRIBUTE_KEYS, sort=True):
        ours = group[group["defense"] == defended]
        undefended = group[group["defense"] == "none"]
        others = {d: pd.concat([undefended, g])
                  for d, g in group[~group["defense"].isin([defended, "none"])].groupby(
                      "defense")}
        curves = {d: _curve(points)[:2] for d, points in others.items()}
        for strength, point in ours.groupby("strength"):
            loss, asr = point["learning_loss"].mean(), point["asr"].mean()
            low, high = interval(point["asr"])
            matched = {d: value for d, (x, y) in curves.items()
                       if np.isfinite(value := at_loss(loss, x, y))}
            best = min(matched, key=matched.get) if matched else None
            base = _asr_bounds(others[best]) if best else None
            base_low, base_high = (float(np.interp(loss, base["learning_loss"], base[side]))
                                   for side in ("low", "high")) if best else (np.nan, np.nan)
            rows.append({**dict(zip(ATTRIBUTE_KEYS, keys)), "strength": strength,
                         "learning_loss": loss, "asr": asr, "asr_low": low, "asr_high": high,
                         "baseline": best, "baseline_asr": matched.get(best, np.nan),
                         "baseline_asr_low": base_low, "baseline_asr_high": base_high,
                         "gap": asr - matched[best] if best else np.nan,
                         "gap_low": low - base_high, "gap_high": high - base_low})
    return pd.DataFrame.from_records(rows, columns=GAP_COLUMNS)


def attribute_tradeoff(table: pd.DataFrame, *, y: str = "asr", hue: str = "defense",
                       panels: str = "adversary", by: str = "strength",
                       title: str = "Attribute inference: ASR against learning loss") -> Figure:
    """ASR (column ``y``) against learning loss (a log axis: the weak settings sit close to
    the undefended run's loss), one curve per ``hue`` value whose points are its ``by``
    values (mean over seeds; numeric ones label the points, but the undefended run's);
    panels: ``panels`` (columns) x round (rows); the dotted line is the panel's mean chance
    (the majority class's share). Where the table has both attackers, the paper's curves
    are solid and the adaptive attacker's dashed with hollow markers, in the same colour,
    the legend naming both line kinds; its points keep the paper's curve's labels."""
    columns = sorted(table[panels].unique(), key=str)
    rounds = sorted(table["round"].unique())
    curves = sorted(table[hue].unique(), key=str)
    styles = series_styles(curves)
    attackers = table["attacker"] if "attacker" in table else pd.Series(PAPER, table.index)
    both = attackers.nunique() > 1
    fig, axes = plt.subplots(max(1, len(rounds)), max(1, len(columns)), squeeze=False,
                             sharex=True, sharey=True, layout="constrained",
                             figsize=(3.4 * len(columns) + 2.0, 3.0 * max(1, len(rounds))))
    for (r, round_), (c, column) in ((a, b) for a in enumerate(rounds)
                                     for b in enumerate(columns)):
        ax = axes[r][c]
        panel = table[(table[panels] == column) & (table["round"] == round_)]
        labels = []
        kind = attackers.loc[panel.index]
        for value, attacker in itertools.product(curves, sorted(kind.unique())):
            points = panel[(panel[hue] == value) & (kind == attacker)]
            if points.empty:
                continue
            x, v, names = _curve(points, y, by)
            style, paper = dict(styles[value]), attacker == PAPER or not both
            if both:
                style.update(linestyle="-" if paper else "--", mfc=None if paper else "none")
            ax.plot(x, v, **style, ms=9 if value == "none" else 4,
                    label=str(value) if paper else f"_{value} ({attacker})")
            if pd.api.types.is_numeric_dtype(points[by]) and value != "none" and paper:
                labels.append((x, v, [f"{n:g}" for n in names], styles[value]["color"]))
        label_points(ax, labels)
        ax.axhline(panel["chance"].mean(), color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"{column}, round {round_}", fontsize=9)
        if r == len(rounds) - 1:
            ax.set_xlabel("learning loss (log)")
        if c == 0:
            ax.set_ylabel("ASR")
    if table.empty:
        axes[0][0].text(0.5, 0.5, "no attribute results", ha="center", va="center")
    elif table["learning_loss"].min() > 0 and \
            table["learning_loss"].max() >= 2 * table["learning_loss"].min():
        log_axis(axes[0][0], "x")  # (losses within a factor 2, as on Adult's stand-in: linear)
    chance = Line2D([], [], color="grey", linestyle=":", linewidth=1, label="chance")
    kinds = [Line2D([], [], color="grey", marker="o", linestyle="-",
                    label="paper's adversary (clean gradients)"),
             Line2D([], [], color="grey", marker="o", mfc="none", linestyle="--",
                    label="adaptive adversary (defended uploads)")] if both else []
    return finish(fig, f"{title} {case_text(table['case'])}".strip(), hue,
                  extra=[*kinds, chance])


def write_attribute_tables(files: list[Path], out_dir: Path) -> dict[str, pd.DataFrame]:
    """``attribute.csv`` and ``attribute_gap.csv`` in ``out_dir``; returns both tables."""
    table = attribute_table(files)
    tables = {"attribute": table, "attribute_gap": attribute_gap(table)}
    for name, df in tables.items():
        write_csv(df, Path(out_dir) / f"{name}.csv")
    return tables
