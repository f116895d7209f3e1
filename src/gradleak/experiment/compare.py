"""``gradleak compare``: the claims' verdicts, then every target's numbers beside the
paper's, as text that fits a 100-column terminal, after a run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd

from gradleak.experiment import claims as planned
from gradleak.experiment import plan
from gradleak.experiment.gather import target_inputs
from gradleak.report.claims import measure_all
from gradleak.report.markdown import beside as cells
from gradleak.report.reference import compare as beside
from gradleak.report.target_data import build_table, select_rows, source_of
from gradleak.report.verdicts import claims_table, summary_line
from gradleak.report.verdicts_doc import number_text

WIDTH = 100


def _claim_lines(claims: pd.DataFrame) -> list[str]:
    """Each claim: its verdict, its numbers, then the paper's words, wrapped to ``WIDTH``."""
    lines = []
    for row in claims.itertuples():
        numbers = (f"ours {number_text(row.ours)} [{number_text(row.ci_low)}, "
                   f"{number_text(row.ci_high)}], holds if {row.expect}; paper "
                   f"{number_text(row.paper_value)}; n {row.n_of} / {row.n_to} a side")
        why = [(f"why: {row.why}", "    ")] if row.why else []
        for text, indent in ((f"{row.claim} ({row.section}): {row.verdict.upper()}", "  "),
                             (numbers, "    "), *why, (f'"{row.statement}"', "    ")):
            lines += textwrap.wrap(text, WIDTH, initial_indent=indent,
                                   subsequent_indent="    ")
    return lines


def _width(text: str) -> int:
    return max(map(len, text.splitlines()))


def _lines(table: pd.DataFrame, keys: list[str], metric: str, width: int) -> str:
    """One metric too wide for a column: a wrapped line per row, its keys first."""
    rows = [", ".join(f"{k}={row[k]}" for k in keys) + f": {metric} {row[metric]}"
            for _, row in table.iterrows()]
    return "\n".join(line for row in rows
                     for line in textwrap.wrap(row, width, subsequent_indent="    "))


def chunks(table: pd.DataFrame, keys: list[str], width: int = WIDTH) -> list[str]:
    """``table`` as text, its metric columns split into blocks that each fit ``width``
    columns, every block with the key columns first (a metric that fits in none: a
    wrapped line per row)."""
    blocks, current = [], []
    for metric in (c for c in table.columns if c not in keys):
        if _width(table[[*keys, metric]].to_string(index=False)) > width:
            blocks.append([metric, None])  # alone, as lines
            continue
        if current and _width(table[[*keys, *current, metric]].to_string(index=False)) > width:
            blocks.append(current)
            current = []
        current.append(metric)
    blocks.append(current)
    return [_lines(table, keys, block[0], width) if block[1:] == [None]
            else table[[*keys, *block]].to_string(index=False) for block in blocks if block]


def compare(config: dict, results: Path) -> str:
    """The claims (``results/claims.csv``'s rows, computed afresh) and every target's
    numbers beside the paper's, each cell "ours (paper's)", as text
    (``gradleak compare``)."""
    blocks, summary, judged = [], [], []
    for name in plan.targets(config):
        spec, reference, on = config["targets"][name], config["reference"].get(name), \
            plan.claims_on(config, name)
        if "table" not in spec or not (reference or on):
            continue
        inputs = select_rows(target_inputs(config, results, name), spec.get("where"))
        table = build_table(spec["table"], inputs)
        if on:
            judged.append(measure_all(on, spec["table"], table,
                                      source_of(inputs, spec["table"]["metrics"]),
                                      study=not inputs.study.empty, fl=inputs.fl))
        if not reference:
            continue
        table_keys = [*spec["table"]["rows"], *spec["table"].get("columns", [])]
        keys = [c for c in reference["columns"] if c in table_keys]
        comparison, agreement = beside(table, table_keys, reference)
        order = ", ".join(f"{m} {a}" for m, a in agreement.items())
        blocks.append("\n".join([*textwrap.wrap(f"{name}: {spec['title']} "
                                               f"({reference['source']})", WIDTH),
                                 "ours (paper's):", *chunks(cells(comparison), keys),
                                 *textwrap.wrap(f"order of rows agrees with the paper for: "
                                                f"{order}", WIDTH)]) + "\n")
        counts = [tuple(map(int, a.split("/"))) for a in agreement.values() if a != "-"]
        summary.append((name, sum(c[0] for c in counts), sum(c[1] for c in counts)))
    head = []
    if config["claims"]:
        claims, _ = claims_table(config["claims"], judged, planned.judged_regime(config),
                                 planned.construction(config), set(plan.studies(config)),
                                 config["paper"] or config["title"], planned.claim_data(config),
                                 config["scale"], planned.scale_conditions(config))
        head = [*textwrap.wrap(f"claims of {claims['paper'].iloc[0]}: {summary_line(claims)}, "
                               f"at {config['scale']} scale (ours with its 95 % interval; n: "
                               "victims or FL runs a side)", WIDTH),
                *_claim_lines(claims),
                *textwrap.wrap(f"what the {config['scale']} scale changes from the paper's "
                               f"configuration: {planned.scale_conditions(config)}"
                               if config["scale"] != "full" else "", WIDTH), ""]
    if not blocks and not head:
        return "no target has reference numbers or claims\n"
    if summary:
        lines = [f"  {name:<8} {agree}/{total}" if total else
                 f"  {name:<8} - (no pair to order)" for name, agree, total in summary]
        agree, total = sum(s[1] for s in summary), sum(s[2] for s in summary)
        blocks.append("pairs of rows ordered as in the paper, per target:\n" + "\n".join(lines)
                      + f"\n  {'all':<8} {agree}/{total}\n")
    return "\n".join([*head, *blocks])
