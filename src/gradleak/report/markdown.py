"""The markdown report: the privacy of every defense at matched utility first, then each
paper target (figure, table, the paper's numbers beside ours), then a one-screen summary
per defense setting; the full tables are the CSVs it links."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from gradleak.report import protocol_ranking
from gradleak.report.matched_utility import markdown_section
from gradleak.report.target_data import TargetResult
from gradleak.report.verdicts_doc import claims_section
from gradleak.settings import PAPER
from gradleak.utils.io import write_text


def _markdown_table(df: pd.DataFrame) -> str:
    """Render ``df`` as a markdown table, floats to 3 significant digits."""
    return "_No data._" if df is None or df.empty else df.to_markdown(index=False, floatfmt=".3g")


def _link(path: Path, report_path: Path) -> str:
    return Path(os.path.relpath(path, report_path.parent)).as_posix()


def setting_summary(tradeoff: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, defense setting): PMM and each attack's mean PSNR."""
    if tradeoff.empty:
        return tradeoff
    psnr = tradeoff.pivot_table(index=["case", "defense", "strength"],
                                columns=["attack", "attacker"], values="psnr")
    psnr = psnr[sorted(psnr.columns, key=lambda c: (c[0], c[1] != PAPER))]  # paper first
    psnr.columns = [f"{attack} PSNR" if attacker == PAPER else f"{attack} ({attacker}) PSNR"
                    for attack, attacker in psnr.columns]
    pmm = tradeoff.groupby(["case", "defense", "strength"])["pmm"].first().rename("PMM")
    return pd.concat([pmm, psnr], axis=1).reset_index()


def beside(comparison: pd.DataFrame) -> pd.DataFrame:
    """The comparison with one "ours (paper)" cell per metric, the paper's with its kind
    where it is not a value ("0.41 (< 0.3)", "5 (8.2, ratio to defense=dp)")."""
    metrics = [c.removesuffix("_paper") for c in comparison.columns if c.endswith("_paper")]
    keys = [c for c in comparison.columns
            if c not in metrics and not c.endswith(("_paper", "_diff", "_kind"))]
    out = comparison[keys].copy()
    for metric in metrics:
        kinds = comparison.get(f"{metric}_kind", pd.Series("value", index=comparison.index))
        out[metric] = [f"{ours:.3g} ({_paper_text(paper, kind)})" for ours, paper, kind
                       in zip(comparison[metric], comparison[f"{metric}_paper"], kinds)]
    return out


def _paper_text(paper: float, kind: str) -> str:
    if kind == "value":
        return f"{paper:.3g}"
    if kind.endswith("bound"):
        return f"{kind.split()[0]} {paper:.3g}"
    return f"{paper:.3g}, {kind}"


def attribute_summary(attribute: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, defense, strength, attacker, attribute, round): learning loss,
    accuracy and each adversary's ASR (mean over seeds), and the chance rate."""
    keys = ["case", "defense", "strength", "attacker", "attribute", "round"]
    wide = attribute.pivot_table(index=keys, columns="adversary", values="asr")
    wide.columns = [f"asr_{a}" for a in wide.columns]
    fl = attribute.groupby(keys)[["learning_loss", "accuracy", "chance"]].mean()
    return fl.join(wide).reset_index()


def _evalnet_lines(evalnet: pd.DataFrame) -> list[str]:
    summary = evalnet.groupby("dataset").agg(monotonic=("monotonic", "all"), n=("ratio", "size"),
                                             error=("error", "max"), allowed=("max_error", "max"))
    return [f"- `{name}`: {'monotonic' if row.monotonic else '**not monotonic**'} over "
            f"{row.n} ratios; its mean prediction at most {row.error:.3f} from the ratio "
            f"({'within' if row.error <= row.allowed else '**beyond**'} the stated "
            f"{row.allowed:g})" for name, row in summary.iterrows()] or ["_No data._"]


def _target_section(target: TargetResult, report_path: Path) -> list[str]:
    lines = [f"## {target.name}: {target.title}"]
    lines += [f"![{target.name}]({_link(f, report_path)})" for f in target.files
              if f.suffix == ".png"]
    if target.comparison is not None:
        agreement = ", ".join(f"{metric} {value}" for metric, value in target.agreement.items())
        lines += ["Ours (the paper's). The order of two rows agrees with the paper's for: "
                  f"{agreement} pairs.", _markdown_table(beside(target.comparison))]
    elif target.table is not None:
        lines.append(_markdown_table(target.table))
    csv = [f"[{f.name}]({_link(f, report_path)})" for f in target.files if f.suffix == ".csv"]
    if csv:
        lines.append("Tables: " + ", ".join(csv))
    return lines


def _departure_line(departure: dict) -> str:
    key = f"`{departure['key']}`: " if "key" in departure else ""
    return (f"- {key}the paper: {departure['paper']}; ours: {departure['ours']}. "
            f"Why: {departure['why']}")


def write_report(tables: dict[str, pd.DataFrame], figures: list[Path],
                 targets: list[TargetResult], report_path: Path,
                 title: str = "gradleak report", substitutions: list[str] | None = None,
                 departures: list[dict] | None = None, claims: pd.DataFrame | None = None,
                 regime: pd.DataFrame | None = None) -> Path:
    """Write the markdown report to ``report_path`` (atomic, no timestamps) and return it;
    ``substitutions`` say what stands in for the paper's data and priors, ``departures``
    (the configuration's) where else it differs from the paper; ``claims`` and ``regime``
    (``results/claims.csv``, ``results/regime.csv``) open it."""
    report_path = Path(report_path)
    sections = [f"# {title}",
                "Made by `gradleak aggregate` from the pipeline's metrics files; rerunning "
                "gives identical files. Success = SSIM > 0.9 (EPAFL); PMM = accuracy / "
                "undefended accuracy x 100 (Refiner §5.3)."]
    if claims is not None:
        sections += claims_section(claims, regime)
    if substitutions:
        sections += ["## Stand-ins", "\n".join(f"- {line}" for line in substitutions)]
    if departures:
        sections += ["## Departures from the paper",
                     "\n".join(_departure_line(d) for d in departures)]
    if "matched_utility" in tables:  # the one table people ask for first (decision 0071)
        sections += markdown_section(tables["matched_utility"])
    if "protocol_ranking" in tables:  # the protocols side by side (decision 0102)
        sections += protocol_ranking.markdown_section(tables["protocol_ranking"])
    for target in targets:
        sections += _target_section(target, report_path)
    if not targets:
        sections += ["## PMM and mean PSNR per defense setting",
                     _markdown_table(setting_summary(tables["tradeoff"]))]
    if "attribute" in tables and not tables["attribute"].empty:
        sections += ["## Attribute inference (RecUP-FL §5.4): ASR per adversary",
                     _markdown_table(attribute_summary(tables["attribute"])),
                     "RecUP-FL against the best other defense at matched learning loss, "
                     "under the same attacker (`gap` < 0: RecUP-FL's ASR is lower):",
                     _markdown_table(tables["attribute_gap"])]
    if "evalnet_monotonicity" in tables:
        sections += ["## Evaluation network monotonicity",
                     "\n".join(_evalnet_lines(tables["evalnet_monotonicity"]))]
    csv = [report_path.parent / "tables" / f"{name}.csv" for name in tables]
    sections += ["## All tables", ", ".join(f"[{p.name}]({_link(p, report_path)})" for p in csv)]
    if figures:
        sections += ["## Figures"] + [f"![{Path(f).stem}]({_link(f, report_path)})"
                                      for f in figures]
    return write_text(report_path, "\n\n".join(sections) + "\n")
