"""Whether a paper's claims hold (decision 0105): each claim's measured quantity
(``report.claims``) judged only where the run is in the paper's regime.

A configuration's ``regime:`` states what a run must show: each attack's undefended
reconstruction (``reconstructs``: a metric of a target's undefended rows at least a
``floor``, or at most a ``ceiling``, beside the paper's value; a mean PSNR also 1 dB above
a uniform image in the data's mean colour, decision 0111, and an attribute ASR its
``above_chance`` above the same rows' chance), undefended FL's learning
(``learns``), at least ``victims`` victims a side and ``seeds`` FL seeds. A claim requires,
by its kind (``utils.metric_kinds.kind_of``), unless its own ``requires:`` says otherwise:

- ``attack``: every attack it reads covered by a ``reconstructs`` entry that holds (on the
  claim's datasets, where the entry names some), and ``victims`` a side;
- ``utility`` (and a claim that picks its rows by an FL metric, ``over``): every
  ``learns`` entry on its datasets, and ``seeds`` FL seeds a side;
- ``attribute``: its adversaries covered by ``reconstructs`` entries, like attacks (on
  the attributes it infers, where an entry names some); matched on learning loss
  (``matched``), also every ``learns`` entry on its datasets;
- ``attribute`` and ``study``: 5 settings, the fewest at which a one-sided sign test can
  reach p < 0.05;

and the metric measured, with an interval. An unmet requirement, or one the plan cannot
meet (``experiment.claims.construction``: the scale, a target or row not planned, an
attack's iterations cut below the paper's), makes the claim **untestable**, its ``why``
naming each with the numbers. A claim in regime **holds** when its interval lies wholly on
``expect``'s side of its bound (within its band, for ``between``), **fails** when it lies
wholly on the other side (outside the band), else it is **inconclusive**; across fixed
settings, by the sign test's p < 0.05 either way.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import scipy.stats

from gradleak.report.claims import MEASURED_COLUMNS
from gradleak.utils.metric_kinds import bar_margin, bar_twin, kind_of, reads_fl, seeds_a_side

VERDICTS = ("holds", "fails", "inconclusive", "untestable")
SIGN_SETTINGS = 5  # 1 / 2**5 = 0.031: the fewest settings a one-sided sign test decides on
ALPHA = 0.05
CLAIM_COLUMNS = ["claim", "paper", "section", "statement", "paper_value", "expect", "ours",
                 "ci_low", "ci_high", "method", "verdict", "why", "rows", "n_of", "n_to",
                 "seeds_of", "seeds_to", "paired", "data", "scale", "conditions"]
REGIME_COLUMNS = ["entry", "requirement", "attacks", "datasets", "target", "of", "metric",
                  "bound", "paper", "source", "ours", "ci_low", "ci_high", "n", "in_regime",
                  "bar"]
BAR_NAMES = {"psnr": "a flat image", "attribute_asr": "chance"}


def expect_text(expect: Mapping) -> str:
    """"< 0.27", "> 0", "in [-4, -2]"."""
    if "between" in expect:
        low, high = expect["between"]
        return f"in [{low:g}, {high:g}]"
    return " ".join(f"{op} {b:g}" for op, b in expect.items())


def verdict(low: float, high: float, expect: Mapping) -> str:
    """holds, fails or inconclusive: where the interval [low, high] lies against
    ``expect`` ({"<": b}, {">": b} or {"between": [lo, hi]})."""
    if np.isnan(low) or np.isnan(high):
        return "inconclusive"
    if "between" in expect:
        lo, hi = expect["between"]
        if lo <= low and high <= hi:
            return "holds"
        return "fails" if high < lo or low > hi else "inconclusive"
    (op, bound), = expect.items()
    if (high < bound) if op == "<" else (low > bound):
        return "holds"
    if (low >= bound) if op == "<" else (high <= bound):
        return "fails"
    return "inconclusive"


def sign_verdict(on: int, settings: int) -> str:
    """A one-sided exact sign test's verdict across fixed settings, ``on`` of which lie on
    the claim's side: holds or fails at p < ``ALPHA`` either way, else inconclusive."""
    if scipy.stats.binom.sf(on - 1, settings, 0.5) < ALPHA:
        return "holds"
    return "fails" if scipy.stats.binom.sf(settings - on - 1, settings, 0.5) < ALPHA \
        else "inconclusive"


def _bound_text(entry: Mapping) -> str:
    return f">= {entry['floor']:g}" if "floor" in entry else f"<= {entry['ceiling']:g}"


def regime_table(regime: Mapping, measured: pd.DataFrame) -> pd.DataFrame:
    """``results/regime.csv``: each regime entry beside what the run measured, in regime
    (yes), not (no) or not measured."""
    rows = []
    for requirement in ("reconstructs", "learns"):
        for entry in regime.get(requirement, []):
            got = measured[measured["claim"] == entry["id"]]
            ours, low, high, n = (got.iloc[0][["ours", "ci_low", "ci_high", "n_of"]]
                                  if len(got) else (np.nan, np.nan, np.nan, 0))
            bar = _bar(entry, measured)
            least = bar + bar_margin(entry) if np.isfinite(bar) else -np.inf
            met = "not measured" if not np.isfinite(ours) else "yes" if (
                ours >= max(entry["floor"], least) if "floor" in entry
                else ours <= entry["ceiling"]) else "no"
            bound = _bound_text(entry) + (
                f" and >= {least:.3g} ({BAR_NAMES[entry['metric']]} {bar:.3g} + "
                f"{bar_margin(entry):g})" if np.isfinite(least) else "")
            rows.append({"entry": entry["id"], "requirement": requirement,
                         "attacks": ";".join(entry.get("attacks", [])),
                         "datasets": ";".join(entry.get("datasets", [])),
                         "target": entry["target"], "of": _rows_text(entry["of"]),
                         "metric": entry["metric"], "bound": bound,
                         "paper": entry.get("paper"), "source": entry["source"],
                         "ours": ours, "ci_low": low, "ci_high": high, "n": int(n),
                         "in_regime": met, "bar": bar})
    return pd.DataFrame(rows, columns=REGIME_COLUMNS)


def _bar(entry: Mapping, measured: pd.DataFrame) -> float:
    """The bar measured on an entry's rows (``bar_twin``), else NaN."""
    twin = bar_twin(entry)
    got = measured[measured["claim"] == twin["id"]] if twin else measured.iloc[:0]
    return float(got.iloc[0]["ours"]) if len(got) else np.nan


def _text(value) -> str:
    """A text column of a measured row ("" where a CSV read it back as NaN)."""
    return value if isinstance(value, str) else ""


def _rows_text(where: Mapping) -> str:
    return ", ".join(f"{k} {v}" for k, v in where.items() if v is not None) or "every row"


def _regime_reasons(entries: list[Mapping], regime: pd.DataFrame) -> list[str]:
    out = []
    for entry in entries:
        row = regime[regime["entry"] == entry["id"]].iloc[0]
        what = f"undefended {'/'.join(entry.get('attacks', [])) or 'FL'} {entry['metric']}"
        paper = "" if entry.get("paper") is None else f", paper {entry['paper']:g}"
        if row["in_regime"] == "not measured":
            out.append(f"{what} not measured ({entry['target']}: {row['of']})")
        elif row["in_regime"] == "no":
            cost = f", in regime at {entry['in_regime_at']}" if "in_regime_at" in entry else ""
            out.append(f"{what} {row['ours']:.3g} not {row['bound']} ({entry['source']}"
                       f"{paper}){cost}")
    return out


def _covering(entries: list[Mapping], names: list[str], datasets: list[str],
              attributes: list[str] = ()) -> list[Mapping]:
    """The entries of the attacks (adversaries) a claim reads, on its datasets and, for an
    adversary, the sensitive attributes it infers (an entry naming none covers all)."""
    return [e for e in entries if set(e.get("attacks", [])) & set(names)
            and (not e.get("datasets") or set(e["datasets"]) & set(datasets))
            and (not e.get("attributes") or set(e["attributes"]) & set(attributes))]


def requirement_reasons(claim: Mapping, measured: Mapping, regime: Mapping,
                        table: pd.DataFrame, study: bool) -> list[str]:
    """Why the run does not meet the claim's regime (empty: it does)."""
    kind, own = kind_of(claim["metric"], study), claim.get("requires", {})
    attacks = [a for a in _text(measured["attacks"]).split(";") if a]
    datasets = [d for d in _text(measured["datasets"]).split(";") if d]
    attributes = [a for a in _text(measured.get("attributes")).split(";") if a]
    entries = {e["id"]: e for part in ("reconstructs", "learns") for e in regime.get(part, [])}
    reasons = []
    if kind in ("attack", "attribute"):
        if "reconstructs" in own:
            needed = [entries[i] for i in own["reconstructs"]]
        else:
            needed = _covering(regime.get("reconstructs", []), attacks, datasets, attributes)
            bare = sorted(set(attacks) - {a for e in needed for a in e["attacks"]})
            reasons += [f"no regime entry says how {a} reconstructs undefended" for a in bare]
        reasons += _regime_reasons(needed, table)
    if reads_fl(claim, study):
        if "learns" in own:
            needed = [entries[i] for i in own["learns"]]
        else:
            needed = [e for e in regime.get("learns", [])
                      if not e.get("datasets") or set(e["datasets"]) & set(datasets)]
            reasons += [] if needed else ["no regime entry says how undefended FL learns"]
        reasons += _regime_reasons(needed, table)
    if seeds_a_side(claim, study):
        seeds = own.get("seeds", regime.get("seeds", 3))
        have = min(measured["seeds_of"], measured["seeds_to"] or measured["seeds_of"])
        if have < seeds:
            reasons.append(f"{have} FL seed{'s' * (have != 1)} a side, "
                           f"{'PMM' if 'pmm' in claim['metric'] else 'utility'} needs {seeds}")
    if kind == "attack":  # the victims attacked (a metric over the successes counts fewer)
        victims = own.get("victims", regime.get("victims", 16))
        have = min(measured["units_of"], measured["units_to"] or measured["units_of"])
        if have < victims:
            reasons.append(f"{have} victims a side, the claim needs {victims}")
    if kind in ("attribute", "study"):
        method = _text(measured["method"])
        settings = int(method.split("/")[-1]) if "/" in method else 0
        if settings < SIGN_SETTINGS:
            reasons.append(f"{settings} fixed setting{'s' * (settings != 1)}: a sign test "
                           f"across them needs {SIGN_SETTINGS} to reach p < {ALPHA:g}")
    return reasons


def judge(claim: Mapping, measured: Mapping, regime: Mapping, regime_rows: pd.DataFrame,
          construction: list[str], study: bool) -> tuple[str, str]:
    """(verdict, why) of one claim from its measurement."""
    reasons = list(construction)
    if measured is None:
        reasons.append(f"not measured: target {claim['target']} has no result")
    else:
        unmet = [r for r in _text(measured["unmet"]).split("; ") if r]
        reasons += unmet
        if not any(r.startswith(("not run", "no row")) or " not measured on " in r
                   or "no value at the same loss" in r for r in unmet):
            reasons += requirement_reasons(claim, measured, regime, regime_rows, study)
    if reasons:
        return "untestable", "; ".join(dict.fromkeys(reasons))
    method = _text(measured["method"])
    if method.startswith("sign"):
        return sign_verdict(*(int(x) for x in method.split()[1].split("/"))), ""
    return verdict(measured["ci_low"], measured["ci_high"], claim["expect"]), ""


def claims_table(claims: list[Mapping], measured: list[pd.DataFrame], regime: Mapping,
                 construction: Mapping[str, list[str]], studies: set[str], paper: str,
                 data: Mapping[str, str], scale: str, conditions: str = ""
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``results/claims.csv`` and ``results/regime.csv``: each claim's words, the paper's
    value, ours with its interval, its verdict and why, from the targets' ``measured``
    frames; ``construction``: claim id -> what the plan cannot meet; ``studies``: the
    targets that are studies; ``data``: claim id -> paper or stand-in, at ``scale``."""
    frame = pd.concat(measured, ignore_index=True) if measured else \
        pd.DataFrame(columns=MEASURED_COLUMNS)
    regime_rows = regime_table(regime, frame)
    rows = []
    for claim in claims:
        got = frame[frame["claim"] == claim["id"]]
        measured_row = got.iloc[0].to_dict() if len(got) else None
        judged, why = judge(claim, measured_row, regime, regime_rows,
                            construction.get(claim["id"], []), claim["target"] in studies)
        m = measured_row or {c: np.nan for c in MEASURED_COLUMNS}
        rows.append({"claim": claim["id"], "paper": paper, "section": claim["section"],
                     "statement": claim["statement"], "paper_value": claim["paper"],
                     "expect": expect_text(claim["expect"]),
                     **{k: m[k] for k in ("ours", "ci_low", "ci_high", "method", "rows",
                                          "n_of", "n_to", "seeds_of", "seeds_to", "paired")},
                     "verdict": judged, "why": why, "data": data[claim["id"]],
                     "scale": scale, "conditions": conditions})
    return pd.DataFrame(rows, columns=CLAIM_COLUMNS), regime_rows


def summary_line(table: pd.DataFrame) -> str:
    """"3 hold, 1 fails, 2 inconclusive, 4 untestable (of 10)"."""
    counts = table["verdict"].value_counts()
    words = {"holds": ("holds", "hold"), "fails": ("fails", "fail"),
             "inconclusive": ("inconclusive", "inconclusive"),
             "untestable": ("untestable", "untestable")}
    parts = [f"{counts[v]} {words[v][int(counts[v] != 1)]}" for v in VERDICTS if counts.get(v)]
    return f"{', '.join(parts)} (of {len(table)})"
