"""Which defense protects best at the same utility (decision 0071): every defense's privacy
against each attack at PMM 90, 95 and 99 % (Refiner §5.3's PMM = defended accuracy /
undefended accuracy x 100, a percent as in ``utility.csv`` and ``tradeoff.csv``).

**The curve.** For each case x attack x attacker (``paper``, or ``adaptive`` where the
attack jobs' rows carry an ``attacker`` column; none: every row is the paper's) x defense
label but ``none``, the points (PMM, mean PSNR, mean SSIM) of ``tradeoff.csv`` (means over
victims and seeds), in strength order: first the undefended run (PMM 100 %, its PSNR), as
``attribute_gap.csv``'s curves start from it, then the label's strengths weakest first (by
its defense's ``stronger`` direction in the schema: fewer quantization bits and lower
clipping bounds are stronger). The adaptive attacker against no defense is the paper's
attack: where the adaptive rows have no undefended run, the paper's one starts the curve.
Points whose PMM or PSNR is missing (a failed run) are left out; ablation settings
(``refiner~beta=0.5``) are not curves of the sweep and are left out too.

**Interpolation.** PMM need not fall monotonically with strength (a weak DP setting may
train a little better than no defense), so the curve is a polyline walked in strength
order, not a function of PMM: the target PMM p is met on the *first* segment, weakest
first, whose end points' PMMs bracket p (ends included), and the PSNR and SSIM there are
interpolated linearly in PMM on that segment (a segment of one PMM equal to p gives its
first end's values). This is the privacy of the mildest setting, between two measured
ones, that costs that much utility. ``strength_interval`` names the segment's ends (``none``:
the undefended run; one strength where p is a measured point's PMM): ``none..s`` with a
weakest setting s far below p (CENSOR's cliff to PMM ~10-55 % here) is a value between no
defense and s, not a measured setting of that utility.

**Never reached.** p is reached exactly when it lies within [lowest PMM, highest PMM] of
the curve, the undefended 100 % included (a continuous polyline crosses every PMM in that
range): below the range none of the defense's strengths costs that much utility (its
strongest setting still keeps more, e.g. clipping, whose PMM stays at or above 100 % here);
above it (p > 100 with every setting below) none keeps that much. Then ``reached`` is
false and ``psnr``, ``ssim`` and ``strength_interval`` are empty: no extrapolation.

**Uncertainty.** ``psnr_low`` and ``psnr_high`` bound the interpolated PSNR: the 95 %
bootstrap intervals of the two bracketing points' means (``tradeoff.csv``'s, over victims
and seeds) interpolated alike. That is wider than an interval of the interpolated mean
itself (the two points' victims are resampled independently, so their errors partly
cancel), and it leaves out the PMM's own uncertainty across FL seeds.

**Best.** Per (case, attack, attacker, pmm), the reached defense with the lowest
interpolated PSNR is ``yes`` when its interval overlaps no other reached defense's;
otherwise it and every reached defense whose interval overlaps its are ``tied`` (a
comparison whose intervals overlap is a tie, not a win; a defense without an interval, from
one victim, ties with all); every other defense is ``no`` (all ``no`` where none reaches p).

**The strongest attacker** (decision 0097). Where a case has several attacks or attackers, each
(case, pmm, defense) also gets a row with ``attack`` ``any`` and ``attacker``
``strongest``: of the rows that reach that PMM, the one with the highest PSNR (the first by
attack and attacker of equal ones), its interval and strengths, and in ``reached_by`` the
attack and attacker that reached it. A defense is only as private as against the worst
attacker that knows it; ``best`` among these rows judges the defenses on that worst case.

Written as ``results/tables/matched_utility.csv``, first in ``report.md`` (one table per
attack and attacker, defenses as rows, PMM 90/95/99 % as columns) and as the heat map
``results/figures/matched_utility.png``.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from gradleak import config as cfg  # noqa: E402
from gradleak.report.style import case_text, finish  # noqa: E402
from gradleak.settings import (  # noqa: E402
    PAPER,
    PROTOCOL_KEYS,
    STRONGEST,
    UNDEFENDED,
    is_ablation,
    label_without,
    protocol_of,
)

PMM_LEVELS = (90, 95, 99)
GROUP_KEYS = ["case", "protocol", "attack", "attacker"]
MATCHED_COLUMNS = [*GROUP_KEYS, "pmm", "defense", "psnr", "psnr_low", "psnr_high", "best",
                   "reached", "ssim", "strength_interval", "reached_by"]
ANY_ATTACK = "any"  # the attack of the strongest attacker's rows
OUTLINES = {"yes": {"linewidth": 2.2, "linestyle": "-"},  # the heat map's marks of `best`
            "tied": {"linewidth": 1.4, "linestyle": "--"}}
NEVER = "—"  # a cell of a defense that never reaches the column's PMM


def with_attacker(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with an ``attacker`` column: rows without one are the paper's attack."""
    return frame if "attacker" in frame else frame.assign(attacker=PAPER)


def defense_directions(config: dict) -> dict[str, str]:
    """Each configured defense label's ``stronger`` direction (``higher``/``lower``), from
    the schema entry of the defense it runs."""
    return {label: cfg.stronger(cfg.registered_name(config, "defenses", label))
            for label in config["defenses"]}


def _direction(label: str, stronger: Mapping[str, str] | None) -> str:
    if stronger is not None and label in stronger:
        return stronger[label]
    name = str(label).split("~")[0]
    return cfg.stronger(name) if name in cfg.schema()["definitions"]["defenses"] else "higher"


def curve(undefended: pd.DataFrame, points: pd.DataFrame, direction: str = "higher"
          ) -> pd.DataFrame:
    """The (name, pmm, psnr, psnr_low, psnr_high, ssim) points of one defense label in
    strength order: the undefended run (name ``none``) first, then the label's strengths
    weakest first (a ``higher`` direction: ascending), points with a missing PMM or PSNR
    left out."""
    start = undefended.assign(name="none")
    steps = points.sort_values("strength", ascending=direction == "higher", kind="stable")
    steps = steps.assign(name=[f"{s:g}" for s in steps["strength"]])
    ordered = pd.concat([start, steps], ignore_index=True).reindex(
        columns=["name", "pmm", "psnr", "psnr_low", "psnr_high", "ssim"])
    return ordered.dropna(subset=["pmm", "psnr"]).reset_index(drop=True)


def crossing(pmm: np.ndarray, target: float) -> tuple[int, float] | None:
    """Where a polyline of PMMs (in strength order) first meets ``target``: (segment i,
    fraction t along it from point i to i + 1); None where ``target`` is outside the
    PMMs' range. A one-point curve meets only its own PMM (0, 0.0)."""
    pmm = np.asarray(pmm, dtype=float)
    if len(pmm) == 1 and pmm[0] == target:
        return 0, 0.0
    for i in range(len(pmm) - 1):
        a, b = pmm[i], pmm[i + 1]
        if min(a, b) <= target <= max(a, b):
            return i, 0.0 if a == b else (target - a) / (b - a)
    return None


def _at(values: np.ndarray, i: int, t: float) -> float:
    """The linear interpolation of ``values`` at fraction ``t`` of segment ``i``."""
    if t in (0.0, 1.0):  # a measured point: its own value (its neighbour's may be NaN)
        return float(values[i + int(t)])
    return float(values[i] + t * (values[i + 1] - values[i]))


def matched_point(points: pd.DataFrame, target: float) -> dict:
    """``reached``, ``psnr`` (its interval's ``psnr_low``, ``psnr_high``), ``ssim`` and
    ``strength_interval`` of a :func:`curve` at PMM ``target``."""
    hit = crossing(points["pmm"].to_numpy(), target)
    values = ("psnr", "psnr_low", "psnr_high", "ssim")
    if hit is None:
        return {"reached": False, **dict.fromkeys(values, np.nan), "strength_interval": None}
    i, t = hit
    names = points["name"].tolist()
    interval = names[i] if t == 0.0 else names[i + 1] if t == 1.0 else f"{names[i]}..{names[i + 1]}"
    return {"reached": True, **{v: _at(points[v].to_numpy(float), i, t) for v in values},
            "strength_interval": interval}


def _undefended(group: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The undefended run of a (case, protocol, attack, attacker) group, or the paper
    attacker's."""
    own = group[group["defense"] == UNDEFENDED]
    return own if not own.empty else paper[paper["defense"] == UNDEFENDED]


def _overlap(a, b) -> bool:
    """Whether two rows' PSNR intervals overlap (a missing interval overlaps any)."""
    if np.isnan([a.psnr_low, a.psnr_high, b.psnr_low, b.psnr_high]).any():
        return True
    return a.psnr_low <= b.psnr_high and b.psnr_low <= a.psnr_high


def mark_best(table: pd.DataFrame) -> pd.Series:
    """``yes``, ``tied`` or ``no`` per row (see the module docstring): the reached defense
    with the lowest PSNR per (case, attack, attacker, pmm) (the first by name of equal
    ones; rows sorted by defense within each group) against the intervals of the others."""
    best = pd.Series("no", index=table.index, dtype=object)
    reached = table[table["reached"]]
    for _, group in reached.groupby([*GROUP_KEYS, "pmm"], sort=False):
        lowest = group.loc[group["psnr"].idxmin()]
        tied = [i for i, row in group.iterrows() if i != lowest.name and _overlap(row, lowest)]
        best[lowest.name] = "tied" if tied else "yes"
        best[tied] = "tied"
    return best


def strongest(table: pd.DataFrame) -> pd.DataFrame:
    """The strongest attacker's rows of a matched-utility ``table`` (see the module
    docstring): per (case, protocol, pmm, defense) with several (attack, attacker) groups,
    the reached row with the highest PSNR, ``reached_by`` naming it."""
    rows = []
    for (case, protocol, level, label), group in table.groupby(
            ["case", "protocol", "pmm", "defense"], sort=True):
        if len(group[["attack", "attacker"]].drop_duplicates()) < 2:
            continue
        reached = group[group["reached"]]
        top = reached.loc[reached["psnr"].idxmax()] if not reached.empty else None
        rows.append({**(top.to_dict() if top is not None else {"reached": False}),
                     "case": case, "protocol": protocol, "attack": ANY_ATTACK,
                     "attacker": STRONGEST, "pmm": level,
                     "defense": label, "reached_by": None if top is None else
                     f"{top['attack']} ({top['attacker']})"})
    return pd.DataFrame.from_records(rows, columns=[c for c in MATCHED_COLUMNS if c != "best"])


def matched_utility(tradeoff: pd.DataFrame, stronger: Mapping[str, str] | None = None,
                    levels: tuple[int, ...] = PMM_LEVELS) -> pd.DataFrame:
    """One row per (case, protocol, attack, attacker, pmm level, defense label but
    ``none``): the label's PSNR and SSIM at that PMM on its curve, whether it reaches it and
    whether it is the best there (see the module docstring). ``protocol``: the label's
    ``fl.`` and ``attack.protocol.`` overrides (``protocols:``; empty: as configured), each
    protocol's curves starting from its own undefended run. ``stronger``: label ->
    ``higher``/``lower`` (default: the schema's direction of a label named after its
    defense)."""
    table = with_attacker(tradeoff)
    table = table.assign(protocol=table["defense"].map(protocol_of),
                         defense=table["defense"].map(lambda d: label_without(d, PROTOCOL_KEYS)))
    table = table[~table["defense"].map(is_ablation).astype(bool)]
    rows = []
    for keys, group in table.groupby(GROUP_KEYS, sort=True):
        case, protocol, attack, _ = keys
        paper = table[(table["case"] == case) & (table["protocol"] == protocol)
                      & (table["attack"] == attack) & (table["attacker"] == PAPER)]
        start = _undefended(group, paper)
        for label, points in group[group["defense"] != UNDEFENDED].groupby("defense",
                                                                            sort=True):
            line = curve(start, points, _direction(label, stronger))
            rows += [{**dict(zip(GROUP_KEYS, keys)), "pmm": level, "defense": label,
                      **matched_point(line, level)} for level in levels]
    df = pd.DataFrame.from_records(rows, columns=[c for c in MATCHED_COLUMNS if c != "best"])
    df = pd.concat([df, strongest(df)], ignore_index=True) if not df.empty else df
    df = df.sort_values([*GROUP_KEYS, "pmm", "defense"], kind="stable").reset_index(drop=True)
    df["reached"] = df["reached"].astype(bool)
    df["best"] = mark_best(df)
    return df[MATCHED_COLUMNS]


def _group_order(attack: str, attacker: str) -> tuple:
    """The strongest attacker first, then by attack, the paper's attacker first."""
    return (attacker != STRONGEST, str(attack), attacker != PAPER, str(attacker))


def _columns(table: pd.DataFrame) -> list[tuple]:
    """(attack, attacker, pmm) in :func:`_group_order`, by PMM."""
    keys = table[["attack", "attacker", "pmm"]].drop_duplicates().itertuples(index=False)
    return sorted(keys, key=lambda k: (*_group_order(k[0], k[1]), k[2]))


def _group_title(attack: str, attacker: str) -> str:
    return "**the strongest attacker**" if attacker == STRONGEST else \
        f"**{attack}**, {attacker} attacker"


def protocol_text(protocol: str) -> str:
    """A protocol's overrides as the report names it (``fl.local_steps=5``)."""
    return protocol.replace("~", ", ") or "the configured protocol"


def _cell(row) -> str:
    if not row.reached:
        return NEVER
    spread = "" if np.isnan(row.psnr_low) else f" [{row.psnr_low:.1f}, {row.psnr_high:.1f}]"
    text = f"{row.psnr:.1f}{spread}"
    text = {"yes": f"**{text}**", "tied": f"*{text}*"}.get(row.best, text)
    return f"{text} {row.reached_by}" if row.attacker == STRONGEST else text


def markdown_section(table: pd.DataFrame) -> list[str]:
    """The report's matched-utility section: one table per (case,) attack and attacker,
    defenses as rows, PMM 90/95/99 % as columns, the best in bold, never reached as —."""
    if table.empty:
        return []
    several = table["case"].nunique() > 1
    protocols = table["protocol"].nunique() > 1
    lines = ["## Privacy at matched utility",
             "Mean PSNR (dB; lower is more private) of each attack's reconstructions under "
             "each defense at the same utility, PMM 90, 95 and 99 %: interpolated linearly on "
             "the defense's (PMM, PSNR) curve, which starts from the undefended run and goes "
             "through its strengths weakest first (the first crossing), with its 95 % "
             "bootstrap interval over victims and seeds. **Bold**: the best defense of the "
             "column, its interval clear of every other's; *italics*: tied for the best (the "
             "lowest PSNR and every defense whose interval overlaps its). "
             f"{NEVER}: the defense never reaches that PMM (no strength "
             "brings the accuracy down that far). "
             "[matched_utility.csv](tables/matched_utility.csv) has the bracketing strengths "
             "and SSIM. The strongest attacker (where there are several): each defense's "
             "highest PSNR over every attack and attacker, with the one that reached it."]
    groups = sorted(table.groupby(GROUP_KEYS, sort=False),
                    key=lambda kv: (kv[0][0], kv[0][1], *_group_order(kv[0][2], kv[0][3])))
    for (case, protocol, attack, attacker), part in groups:
        wide = part.assign(cell=[_cell(r) for r in part.itertuples()]).pivot(
            index="defense", columns="pmm", values="cell")
        wide = wide.reindex(sorted(wide.index, key=str)).reindex(
            columns=sorted(wide.columns))
        wide.columns = [f"PMM {p:g} %" for p in wide.columns]
        where = [case] * several + [protocol_text(protocol)] * protocols
        title = _group_title(attack, attacker) + (f" ({', '.join(where)})" if where else "")
        lines += [title, wide.reset_index().to_markdown(index=False)]
    return lines


def heatmap(table: pd.DataFrame) -> Figure:
    """Rows: defense labels; columns: attack x attacker x PMM; cell: the interpolated mean
    PSNR, annotated; the best of each column outlined, those tied for it dashed,
    never-reached cells hatched grey.
    One panel per case and protocol."""
    cases = sorted(table[["case", "protocol"]].drop_duplicates().itertuples(index=False),
                   key=lambda cp: (str(cp[0]), cp[1])) or [("", "")]
    columns = _columns(table)
    defenses = sorted(table["defense"].unique(), key=str)
    finite = table["psnr"].dropna()
    vmin, vmax = (finite.min(), finite.max()) if len(finite) else (0.0, 1.0)
    fig, axes = plt.subplots(len(cases), 1, squeeze=False, layout="constrained",
                             figsize=(0.42 * max(1, len(columns)) + 4.5,
                                      (0.32 * max(1, len(defenses)) + 2.4) * len(cases)))
    for ax, case in zip(axes[:, 0], cases, strict=True):
        part = table[(table["case"] == case[0]) & (table["protocol"] == case[1])].set_index(
            ["defense", "attack", "attacker", "pmm"])
        psnr = part["psnr"].unstack(["attack", "attacker", "pmm"]).reindex(
            index=defenses, columns=pd.MultiIndex.from_tuples(columns)).astype(float)
        best = part["best"].unstack(["attack", "attacker", "pmm"]).reindex(
            index=defenses, columns=pd.MultiIndex.from_tuples(columns)).fillna("no")
        ax.set_facecolor("#dddddd")
        if psnr.size == 0:
            continue
        sns.heatmap(psnr.to_numpy(), ax=ax, mask=psnr.isna().to_numpy(), annot=True, fmt=".1f",
                    annot_kws={"fontsize": 6}, cmap="mako", vmin=vmin, vmax=vmax,
                    linewidths=0.5, linecolor="white", cbar=ax is axes[0, 0],
                    cbar_kws={"label": "mean PSNR (dB), lower is more private"},
                    xticklabels=[f"{p:g}" for *_, p in columns], yticklabels=defenses)
        for i, j in zip(*np.nonzero(psnr.isna().to_numpy())):
            ax.add_patch(Rectangle((j, i), 1, 1, fill=False, hatch="///", edgecolor="#999999",
                                   linewidth=0))
        for mark, style in OUTLINES.items():
            for i, j in zip(*np.nonzero(best.to_numpy() == mark)):
                ax.add_patch(Rectangle((j + 0.06, i + 0.06), 0.88, 0.88, fill=False,
                                       edgecolor="#d55e00", **style))
        groups = [(a, k) for a, k, _ in columns]
        starts = [j for j in range(len(groups)) if j == 0 or groups[j] != groups[j - 1]]
        for j in starts[1:]:
            ax.axvline(j, color="white", linewidth=3)
        ends = [*starts[1:], len(groups)]
        top = ax.secondary_xaxis("top")
        top.set_xticks([(s + e) / 2 for s, e in zip(starts, ends, strict=True)],
                       labels=["strongest\nattacker" if groups[s][1] == STRONGEST else
                               f"{groups[s][0]}\n{groups[s][1]}" for s in starts],
                       rotation=90, fontsize="x-small")
        top.tick_params(length=0)
        ax.set(xlabel="PMM (%)", ylabel="defense")
        ax.tick_params(axis="x", labelsize="x-small", rotation=0)
        ax.tick_params(axis="y", labelsize="small", rotation=0)
        if len(cases) > 1:
            ax.set_title(", ".join(filter(None, [case[0], protocol_text(case[1])
                                                 if table["protocol"].nunique() > 1 else ""])),
                         fontsize=9)
    if table.empty:
        axes[0, 0].text(0.5, 0.5, "no defense curves", ha="center", va="center",
                        transform=axes[0, 0].transAxes)
    legend = [Patch(facecolor="#dddddd", hatch="///", edgecolor="#999999",
                    label="never reaches this PMM"),
              Patch(fill=False, edgecolor="#d55e00", label="best of the column", **OUTLINES["yes"]),
              Patch(fill=False, edgecolor="#d55e00", label="tied for the best (intervals overlap)",
                    **OUTLINES["tied"])]
    return finish(fig, "Mean PSNR at matched utility: each defense interpolated at PMM 90, 95 "
                       f"and 99 % {case_text(table['case'])}".strip(), extra=legend)
