"""A paper's table or figure (a configuration's ``targets:`` entry) from the runs it selects:
a tidy CSV, the paper's numbers beside ours, and a figure shaped like the paper's.

The experiment layer gathers the runs into :class:`TargetInputs`; every frame carries the
key columns ``case, dataset, model, defense, strength, series, seed`` (and ``attack``
where an attack ran; ``adversary, attribute, round`` in the attribute frame) plus one column per
swept configuration path, under its full dotted name and its last component
(``attacks.hybrid.stopper.threshold`` and ``threshold``). A target's ``where`` keeps only
the rows whose columns hold the listed values (:func:`select_rows`).
"""


from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")


import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from gradleak.report.style import (  # noqa: E402
    case_text,
)
from gradleak.report.tables import SUCCESS_SSIM  # noqa: E402
from gradleak.utils.keys import same  # noqa: E402
from gradleak.utils.metric_kinds import ATTRIBUTE_METRICS, FL_METRICS  # noqa: E402

# RecUP-FL's attribute jobs: the adversary's accuracy, the majority class's share and the
# FL run's final test loss, one row per (point, seed, adversary, attribute, round)
STATISTICS = {"mean": "mean", "max": "max", "min": "min", "sum": "sum", "median": "median",
              "sd": lambda v: v.std(ddof=0)}
LABELS = {"asr": "ASR (SSIM > 0.9)", "psnr": "PSNR (dB)", "ssim": "SSIM", "mse": "MSE",
          "lpips": "LPIPS", "stlpips": "ST-LPIPS", "noise_ratio": "noise ratio",
          "iterations": "iterations", "wall_time": "time (s)", "accuracy": "test accuracy",
          "pmm": "PMM (%)", "test_loss": "test loss", "final_loss": "final gradient loss",
          "fallback": "clean-gradient fallbacks", "fallback_rate": "share of clean uploads",
          "attribute_asr": "attribute ASR", "learning_loss": "learning loss",
          "chance": "chance (majority share)", "psnr_best": "best PSNR in the batch (dB)",
          "ssim_best": "best SSIM in the batch",
          "pairwise_ssim": "SSIM between victims' reconstructions",
          "truth_pairwise_ssim": "SSIM between victims' true images",
          "label_correct": "share of labels inferred",
          "robust_mse": "MSE(x, x*) of Refiner's robust data"}


@dataclass
class TargetInputs:
    victims: pd.DataFrame   # one row per (point, seed, attack, victim)
    fl: pd.DataFrame        # one row per (point, seed): final accuracy, pmm, test_loss
    history: pd.DataFrame   # one row per (point, seed, evaluated round)
    details: pd.DataFrame   # one row per (point, seed, attack): its details folder
    # one row per (point, seed, adversary, attribute, round): attribute_asr, chance,
    # learning_loss, accuracy (RecUP-FL's attribute jobs)
    attribute: pd.DataFrame = field(default_factory=pd.DataFrame)
    # a study's rows (a target with `study:` in place of runs) and its images by name
    study: pd.DataFrame = field(default_factory=pd.DataFrame)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class TargetResult:
    name: str
    title: str
    table: pd.DataFrame | None
    comparison: pd.DataFrame | None
    agreement: dict[str, str]
    files: list[Path]
    claims: pd.DataFrame | None = None  # the claims (and regime entries) on it, measured


def split_metric(metric: str) -> tuple[str, str]:
    """"psnr:max" -> ("psnr", "max"); "asr" -> ("ssim", "asr"); default statistic mean."""
    if metric == "asr":
        return "ssim", "asr"
    column, _, stat = metric.partition(":")
    return column, stat or "mean"


def aggregate(frame: pd.DataFrame, keys: list[str], metrics: list[str],
               over: str = "all") -> pd.DataFrame:
    """One row per combination of ``keys`` with each metric's statistic over its rows, or
    (``over`` "successes") over its successful victims' rows, the ASR over all of them."""
    if frame.empty:
        return pd.DataFrame(columns=[*keys, *metrics])
    grouped = frame.groupby(keys, dropna=False, sort=True)
    counted = grouped if over == "all" else frame[frame["ssim"] > SUCCESS_SSIM].groupby(
        keys, dropna=False, sort=True)
    out = {}
    for metric in metrics:
        column, stat = split_metric(metric)
        if stat == "asr":
            out[metric] = grouped[column].agg(lambda v: float((v > SUCCESS_SSIM).mean()))
        else:  # a row without successes: NaN
            out[metric] = counted[column].agg(STATISTICS[stat])
    return pd.DataFrame(out).reset_index()


def source_of(inputs: TargetInputs, metrics: list[str]) -> pd.DataFrame:
    """The attribute jobs when a metric is an attribute metric (the others read from there
    too: accuracy is a column of it), the FL runs when every metric is an FL metric, else
    the attacked victims."""
    columns = [split_metric(m)[0] for m in metrics]
    if not inputs.study.empty:
        return inputs.study
    if any(c in ATTRIBUTE_METRICS for c in columns):
        return inputs.attribute
    return inputs.fl if all(m in FL_METRICS for m in metrics) else inputs.victims


def select_rows(inputs: TargetInputs, where: dict | None) -> TargetInputs:
    """``inputs`` with only the rows whose columns hold one of ``where``'s values
    (column -> values), in each frame that has the column."""
    if not where:
        return inputs

    def kept(frame: pd.DataFrame) -> pd.DataFrame:
        mask = np.ones(len(frame), dtype=bool)
        for column, values in where.items():
            if column in frame:
                mask &= frame[column].map(
                    lambda v, wanted=values: any(same(v, w) for w in wanted)).to_numpy(dtype=bool)
        return frame[mask].reset_index(drop=True)

    return replace(inputs, **{f.name: kept(getattr(inputs, f.name)) for f in fields(inputs)
                              if isinstance(getattr(inputs, f.name), pd.DataFrame)})


def build_table(spec: dict, inputs: TargetInputs) -> pd.DataFrame:
    """The target's tidy table: its row and column keys, then its metrics."""
    keys = [*spec["rows"], *spec.get("columns", [])]
    source = source_of(inputs, spec["metrics"])
    over = spec.get("over", "all")
    if over == "successes" and "ssim" not in source:
        raise ValueError(f"table.over: successes needs victims with an SSIM; the metrics "
                         f"{spec['metrics']} read {sorted(source.columns)[:8]}")
    return aggregate(source, keys, spec["metrics"], over)


def figure_title(title: str, *frames: pd.DataFrame) -> str:
    """The target's title and the cases its figure draws."""
    cases = [c for frame in frames if "case" in frame for c in frame["case"].dropna()]
    return textwrap.fill(f"{title} {case_text(cases)}".strip(), 80, break_on_hyphens=False)


def panel_parts(data: pd.DataFrame, panels: str | None) -> list[tuple[str, pd.DataFrame]]:
    if panels is None:
        return [("", data)]
    return [(f"{panels} = {value}", part) for value, part in data.groupby(panels, sort=True)]


PAPER = Line2D([], [], color="grey", marker="o", markerfacecolor="none", linestyle="none",
               label="paper (hollow)")

