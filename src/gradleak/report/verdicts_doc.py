"""The verdicts as a reader meets them (decision 0105): per paper, first the regime box
(each attack's undefended reconstruction and undefended FL's learning, ours beside the
paper's, in regime or not), then the counts (untestable split by reason), then each claim
with the paper's value, ours with its interval, the rows it read and n a side, and under it
the run: its commit, scale, command and CPU-hours. ``report.md`` opens with the same
section; ``gradleak verdicts`` writes docs/verdicts.md from kept runs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from gradleak.report.verdicts import summary_line


def number_text(value: float) -> str:
    """A number to 3 significant digits ("-" where there is none)."""
    return "-" if pd.isna(value) else f"{value:.3g}"


def texts(column: pd.Series) -> pd.Series:
    """A text column as read back from a CSV: "" where it was empty."""
    return column.map(lambda v: v if isinstance(v, str) else "")


def table_text(df: pd.DataFrame) -> str:
    """``df`` as a markdown table, floats to 3 significant digits."""
    return "_No data._" if df is None or df.empty else df.to_markdown(index=False, floatfmt=".3g")


@dataclass
class Run:
    """A kept run: its claims.csv and regime.csv, notes, and how it was made (``commit``,
    ``command``, ``cpu_hours``, ``machine``: the keys of its .run.json; ``withdrawn``: why
    its verdicts no longer stand, and ``paper``, in place of its claims)."""

    claims: pd.DataFrame | None
    regime: pd.DataFrame | None = None
    notes: str | None = None
    made: dict = field(default_factory=dict)


def merged(parts: list[Run]) -> Run:
    """One paper's run made in parts, each leaving the others' claims out (docs/papers.md,
    a run longer than one sitting): each claim's row from the part that planned it, each
    regime entry as a part measured it, the notes and how each part was made."""
    if len(parts) == 1:
        return parts[0]
    claims = pd.concat([part.claims for part in parts], ignore_index=True)
    order = {claim: i for i, claim in enumerate(dict.fromkeys(claims["claim"]))}
    left_out = texts(claims["why"]).str.startswith("left out")
    claims = (claims.assign(_left_out=left_out).sort_values("_left_out", kind="stable")
              .drop_duplicates("claim").sort_values("claim", key=lambda c: c.map(order))
              .drop(columns="_left_out"))
    regimes = [part.regime for part in parts if part.regime is not None]
    regime = None
    if regimes:
        regime = pd.concat(regimes, ignore_index=True)
        regime = (regime.assign(_unmeasured=regime["n"].fillna(0) == 0)
                  .sort_values("_unmeasured", kind="stable")
                  .drop_duplicates(["entry", "of"]).sort_index().drop(columns="_unmeasured"))
    made = [part.made for part in parts]
    return Run(claims.reset_index(drop=True), regime,
               "\n\n".join(part.notes.strip() for part in parts if part.notes) or None,
               {"commit": "`, then `".join(m.get("commit", "-") for m in made),
                "command": "`, then `".join(m.get("command", "-") for m in made),
                "cpu_hours": sum(m.get("cpu_hours") or 0 for m in made) or None,
                "machine": "; ".join(m["machine"] for m in made if m.get("machine"))})


def regime_box(regime: pd.DataFrame | None) -> list[str]:
    """The regime: each entry, ours with its interval beside its bound and the paper's."""
    if regime is None or regime.empty:
        return ["**Regime**: the configuration states none, so no claim on an attack or on "
                "FL utility can be judged (each is untestable)."]
    shown = pd.DataFrame({
        "what": [f"{'undefended ' + a.replace(';', ', ') if a else 'undefended FL'} "
                 f"({m})" if r == "reconstructs" else f"undefended FL ({m})"
                 for a, m, r in zip(texts(regime["attacks"]), regime["metric"],
                                    regime["requirement"])],
        "measured on": [f"{t}: {o}" for t, o in zip(regime["target"], regime["of"])],
        "ours [95 % CI]": [f"{number_text(o)} [{number_text(lo)}, {number_text(hi)}]"
                           for o, lo, hi in zip(regime["ours"], regime["ci_low"],
                                                regime["ci_high"])],
        "n": regime["n"], "in regime if": regime["bound"],
        "paper": [f"{number_text(p)} ({s})" for p, s in zip(regime["paper"], regime["source"])],
        "in regime": regime["in_regime"].map(lambda v: f"**{v}**")})
    return ["**Regime**: what the run must show before a claim on it may hold or fail.",
            table_text(shown)]


def counts_lines(claims: pd.DataFrame) -> list[str]:
    """The counts, then the untestable claims grouped by their first reason's kind."""
    lines = [f"**{summary_line(claims)}**."]
    untestable = claims[claims["verdict"] == "untestable"]
    reasons = Counter()
    named: dict[str, list[str]] = {}
    for claim, why in zip(untestable["claim"], texts(untestable["why"])):
        for reason in dict.fromkeys(_kind(r) for r in str(why).split("; ") if r):
            reasons[reason] += 1
            named.setdefault(reason, []).append(f"`{claim}`")
    lines += [f"- untestable for {reason}: {n} ({', '.join(named[reason])})"
              for reason, n in reasons.most_common()]
    return ["\n".join(lines)]


def _kind(reason: str) -> str:
    """A reason without its numbers: what it is about."""
    for key, text in (("smoke scale", "the smoke scale"),
                      ("left to ", "a part of the run still to make (docs/papers.md)"),
                      ("left out", "its cost at this scale"),
                      ("not planned", "rows not planned at this scale"),
                      ("is planned", "rows not planned at this scale"),
                      ("not run", "rows not run"), ("iterations", "attack budgets cut"),
                      ("FL seed", "too few FL seeds"), ("victims a side", "too few victims"),
                      ("fixed setting", "too few fixed settings"),
                      ("regime entry", "no regime stated"),
                      ("undefended", "an undefended attack or FL out of regime"),
                      ("not measured", "a metric not measured"),
                      ("same loss", "a baseline whose curve misses the defense's loss"),
                      ("interval", "no interval"),
                      ("units", "no interval")):
        if key in reason:
            return text
    return reason


def claims_table_text(claims: pd.DataFrame) -> str:
    shown = pd.DataFrame({
        "claim": claims["claim"], "section": claims["section"],
        "the paper says": claims["statement"].map(lambda s: f"\"{s}\""),
        "paper": claims["paper_value"].map(number_text), "holds if": claims["expect"],
        "ours [95 % CI]": [f"{number_text(o)} [{number_text(lo)}, {number_text(hi)}]"
                           for o, lo, hi in zip(claims["ours"], claims["ci_low"],
                                                claims["ci_high"])],
        "verdict": claims["verdict"].map(lambda v: f"**{v}**"),
        "why": texts(claims["why"]), "rows (of / to)": texts(claims["rows"]),
        "n a side": [f"{a:.0f} / {b:.0f}" if pd.notna(a) else "-"
                     for a, b in zip(claims["n_of"], claims["n_to"].fillna(0))]})
    return table_text(shown)


def claims_section(claims: pd.DataFrame, regime: pd.DataFrame | None,
                   heading: str = "## Does the paper's claim hold?",
                   link: str = "[claims.csv](claims.csv) and [regime.csv](regime.csv) have "
                               "every column.", made: dict | None = None) -> list[str]:
    """The regime box, the counts, the claims and what the run was."""
    scale, data = (" and ".join(sorted(set(claims[c].astype(str)))) for c in ("scale", "data"))
    conditions = sorted({c for c in texts(claims["conditions"]) if c})
    run = []
    if made:
        run = [f"Run: commit `{made.get('commit', '-')}`, scale {scale}, "
               f"`{made.get('command', '-')}`, {number_text(made.get('cpu_hours'))} CPU-hours"
               f"{' on ' + made['machine'] if made.get('machine') else ''}."]
    return [heading, *regime_box(regime), *counts_lines(claims),
            f"At {scale} scale on {data} data. Ours is the claim's quantity (a metric, or its "
            "difference or ratio between rows; paired where both sides read the same victims "
            "or FL seeds) with a 95 % interval that keeps its coverage at 8-16 units "
            "(studentized bootstrap; Newcombe's for rates; a sign test across fixed "
            "settings). A claim in regime holds or fails only when its interval lies wholly "
            "on one side of its bound (inside or outside its band), else it is "
            f"inconclusive. {link}".strip(),
            claims_table_text(claims), *run,
            *(f"What the {scale} scale changes from the paper's configuration: {c}."
              for c in conditions)]


def verdicts_text(runs: list[Run]) -> str:
    """docs/verdicts.md: per paper, its section from its kept run (or the parts of one,
    :func:`merged`), then the run's notes."""
    sections = ["# Verdicts",
                "Written by `gradleak verdicts` from the runs kept in docs/verdicts/ (each "
                "run's claims.csv, regime.csv, its .run.json and the notes in its .md), not by "
                "hand. A verdict is made only in the paper's regime: where the undefended "
                "attack does not reconstruct, undefended FL does not learn, or the scale "
                "cannot decide the claim, it is **untestable**, with why. The full "
                "configurations' departures from the papers are in their files and reports."]
    papers: dict[str, list[Run]] = {}
    for run in runs:
        paper = run.made["paper"] if run.claims is None else run.claims["paper"].iloc[0]
        papers.setdefault(paper, []).append(run)
    for parts in papers.values():
        run = parts[0] if parts[0].claims is None else merged(parts)
        if run.claims is None:
            sections += [f"## {run.made['paper']}", f"**Withdrawn.** {run.made['withdrawn']}"]
            continue
        sections += claims_section(run.claims, run.regime, f"## {run.claims['paper'].iloc[0]}",
                                   link="", made=run.made)
        if run.notes:
            sections += [f"Reading these verdicts: {run.notes.strip()}"]
    return "\n\n".join(sections) + "\n"
