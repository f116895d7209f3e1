"""Does the ranking of defenses change with the FL protocol (decision 0102)? The matched-utility
table (``matched_utility.csv``) of a configuration with several ``protocols:`` (FedSGD, one
gradient; FedAvg, K local steps on a batch of B) judges every defense at PMM 90, 95 and 99 %
under each protocol against its own undefended run; this puts the protocols side by side.

**Ranks.** Per (case, attack, attacker, pmm, protocol), the reached defenses ranked by their
interpolated mean PSNR, lowest (most private) first (``rank`` 1; ties in PSNR share the
lower rank; a defense that never reaches the PMM has none). ``best`` is the matched-utility
table's: ``yes``, ``tied`` (its interval overlaps the lowest one's) or ``no``.

**Summary.** Per (case, attack, attacker, pmm) and protocol after the first: ``first`` the
defenses marked best (``yes`` or ``tied``) under each protocol; ``first_kept`` whether the
two protocols share one of them (a clear change of the best defense is two disjoint sets);
``spearman`` the rank correlation of the PSNRs over the defenses that reach the PMM under
both (none with fewer than three), against the first protocol (the configured one where it
is among them).

Written as ``results/tables/protocol_ranking.csv``, a section of ``report.md`` and
``results/figures/protocol_ranking.png`` (the strongest attacker's PSNR per defense, one line
per defense across the protocols, one panel per PMM).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from gradleak.report.matched_utility import protocol_text  # noqa: E402
from gradleak.report.style import case_text, finish, series_styles  # noqa: E402
from gradleak.settings import STRONGEST

KEYS = ["case", "attack", "attacker", "pmm"]
RANKING_COLUMNS = [*KEYS, "defense", "protocol", "psnr", "psnr_low", "psnr_high", "rank",
                   "best"]
NONE_REACHED = "none reaches it"
SUMMARY_COLUMNS = [*KEYS, "protocol", "first", "versus", "versus_first", "first_kept",
                   "spearman", "defenses"]


def protocol_ranking(matched: pd.DataFrame, order: Sequence[str] = ()) -> pd.DataFrame:
    """The long table of ranks (see the module docstring); empty with one protocol. The
    protocols named in ``order`` come first, in that order, the rest by name."""
    if matched.empty or matched["protocol"].nunique() < 2:
        return pd.DataFrame(columns=RANKING_COLUMNS)
    table = matched.copy()
    reached = table["psnr"].where(table["reached"].astype(bool))
    table["rank"] = reached.groupby([table[k] for k in [*KEYS, "protocol"]]).rank(method="min")
    position = {name: i for i, name in enumerate(order)}

    def ordered(column: pd.Series) -> pd.Series:
        if column.name != "protocol":
            return column
        return column.map(lambda p: f"{position.get(p, len(position)):04d}{p}")

    return table.sort_values([*KEYS, "protocol", "defense"], kind="stable", key=ordered)[
        RANKING_COLUMNS].reset_index(drop=True)


def _first(part: pd.DataFrame) -> list[str]:
    return sorted(part.loc[part["best"].isin(["yes", "tied"]), "defense"])


def ranking_summary(ranking: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, attack, attacker, pmm) and protocol after the first: the best
    defenses under each and how alike the two orders are (see the module docstring)."""
    rows = []
    for keys, group in ranking.groupby(KEYS, sort=True):
        protocols = list(dict.fromkeys(group["protocol"]))  # the ranking's order
        base = group[group["protocol"] == protocols[0]].set_index("defense")
        for protocol in protocols[1:]:
            other = group[group["protocol"] == protocol].set_index("defense")
            both = base["psnr"].dropna().index.intersection(other["psnr"].dropna().index)
            rho = spearmanr(base.loc[both, "psnr"], other.loc[both, "psnr"]).statistic \
                if len(both) >= 3 else np.nan
            first, versus = _first(other.reset_index()), _first(base.reset_index())
            rows.append({**dict(zip(KEYS, keys)), "protocol": protocol,
                         "first": ", ".join(first), "versus": protocols[0],
                         "versus_first": ", ".join(versus),
                         "first_kept": bool(set(first) & set(versus)),
                         "spearman": float(rho), "defenses": len(both)})
    return pd.DataFrame.from_records(rows, columns=SUMMARY_COLUMNS)


def markdown_section(ranking: pd.DataFrame) -> list[str]:
    """The report's side-by-side section: per attack, attacker and PMM, the best defenses
    under each protocol and the rank correlation."""
    summary = ranking_summary(ranking)
    if summary.empty:
        return []
    one = summary["protocol"].nunique() == 1  # two protocols: each names its column
    shown = pd.DataFrame({
        "attack": [("the strongest attacker" if r.attacker == STRONGEST
                    else f"{r.attack} ({r.attacker})") for r in summary.itertuples()],
        "PMM %": summary["pmm"].map("{:g}".format),
        f"best: {protocol_text(summary['versus'].iloc[0])}":
            summary["versus_first"].replace("", NONE_REACHED),
        f"best: {protocol_text(summary['protocol'].iloc[0])}" if one else "best: other":
            [(r.first or NONE_REACHED) + ("" if one else f" ({protocol_text(r.protocol)})")
             for r in summary.itertuples()],
        "best kept": summary["first_kept"].map({True: "yes", False: "**no**"}),
        "Spearman ρ (defenses)": [f"{r.spearman:.2f} ({r.defenses})" if np.isfinite(r.spearman)
                                  else f"— ({r.defenses})" for r in summary.itertuples()]})
    if summary["case"].nunique() > 1:
        shown.insert(0, "case", summary["case"])
    return ["## Does the ranking of defenses change with the protocol?",
            "Each protocol's matched-utility table judged side by side: the defenses marked "
            "best (lowest mean PSNR at that PMM, or tied with it, intervals overlapping) "
            "under each protocol, whether the two sets share a defense, and the rank "
            "correlation of the defenses' PSNRs over those that reach that PMM under both. "
            "[protocol_ranking.csv](tables/protocol_ranking.csv) has every defense's rank.",
            shown.to_markdown(index=False)]


def figure(ranking: pd.DataFrame) -> Figure:
    """The strongest attacker's (else the first attack's) interpolated PSNR of each defense
    under each protocol, a line per defense, one panel per PMM level."""
    attacker = STRONGEST if (ranking["attacker"] == STRONGEST).any() else None
    shown = ranking[ranking["attacker"] == attacker] if attacker else \
        ranking[ranking["attack"] == ranking["attack"].min()]
    levels = sorted(shown["pmm"].unique())
    protocols = list(dict.fromkeys(shown["protocol"]))  # the ranking's order
    styles = series_styles(sorted(shown["defense"].unique(), key=str))
    fig, axes = plt.subplots(1, max(1, len(levels)), squeeze=False, sharey=True,
                             figsize=(3.4 * max(1, len(levels)) + 1.6, 4.2),
                             layout="constrained")
    for ax, level in zip(axes[0], levels, strict=False):
        for defense, part in shown[shown["pmm"] == level].groupby("defense", sort=True):
            part = part.set_index("protocol").reindex(protocols)
            x = np.arange(len(protocols))
            ax.plot(x, part["psnr"].to_numpy(float), **styles[defense], label=defense)
        ax.set_xticks(np.arange(len(protocols)),
                      [protocol_text(p).replace(", ", "\n") for p in protocols],
                      fontsize="x-small")
        ax.set(title=f"PMM {level:g} %", ylabel="mean PSNR (dB), lower is more private")
        ax.grid(alpha=0.3)
    who = "the strongest attacker" if attacker else str(shown["attack"].min())
    return finish(fig, f"Defenses at matched utility under each protocol ({who}; a line that "
                       f"crosses another is a change of rank) {case_text(shown['case'])}".strip())
