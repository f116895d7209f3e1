"""Markdown report: trade-off and utility tables, evalnet check and embedded figures."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from fedleak.utils.io import write_text


def _markdown_table(df: pd.DataFrame) -> str:
    """Render ``df`` as a markdown table, floats to 3 significant digits."""
    return "_No data._" if df.empty else df.to_markdown(index=False, floatfmt=".3g")


def utility_summary(utility: pd.DataFrame) -> pd.DataFrame:
    """Mean final accuracy and PMM per (case, defense, strength) across seeds."""
    grouped = utility.groupby(["case", "defense", "strength"])
    return grouped.agg(
        seeds=("seed", "nunique"),
        final_accuracy=("final_accuracy", "mean"),
        pmm=("pmm", "mean"),
    ).reset_index()


def _evalnet_lines(evalnet: pd.DataFrame) -> list[str]:
    summary = evalnet.groupby("dataset").agg(monotonic=("monotonic", "all"), n=("ratio", "size"))
    lines = [
        f"- `{name}`: {'monotonic' if row.monotonic else '**not monotonic**'} over {row.n} ratios"
        for name, row in summary.iterrows()
    ]
    return lines or ["_No data._"]


def write_report(
    tables: dict[str, pd.DataFrame],
    figures: list[Path],
    report_path: Path,
    title: str = "fedleak report",
) -> Path:
    """Write the markdown report to ``report_path`` (atomic, no timestamps) and return it."""
    report_path = Path(report_path)
    links = [
        f"![{Path(fig).stem}]({Path(os.path.relpath(fig, report_path.parent)).as_posix()})"
        for fig in figures
    ]
    sections = [
        f"# {title}",
        "Made by `fedleak.report` from the pipeline's metrics JSON files "
        "(full tables: the CSV files written by `write_tables`); rerunning gives identical files.",
        "## Privacy-utility trade-off",
        "Means over attack seeds and victims; success = SSIM >= 0.9 (EPAFL); "
        "PMM = accuracy / undefended accuracy x 100 (Refiner §5.3).",
        _markdown_table(tables["tradeoff"]),
        "## CENSOR Table I layout",
        "Per defense setting and attack: MSE and LPIPS (higher = more private), "
        "PSNR and SSIM (lower = more private).",
        _markdown_table(tables["censor_table"]),
        *(["## Ablation (Refiner Tables 6-9)",
           "One parameter varied at a time at a fixed strength; `default` marks the "
           "main run's value.",
           _markdown_table(tables["ablation"])] if "ablation" in tables else []),
        "## Utility",
        _markdown_table(utility_summary(tables["utility"])),
        "## Evaluation network monotonicity",
        "\n".join(_evalnet_lines(tables["evalnet_monotonicity"])),
        "## Figures",
        "\n\n".join(links) or "_No figures._",
    ]
    return write_text(report_path, "\n\n".join(sections) + "\n")
