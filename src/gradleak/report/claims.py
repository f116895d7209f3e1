"""A claim's quantity measured on its target's results (decision 0105); what the run must
show before it may decide the claim is ``report.verdicts``'.

The quantity is a metric of the target's table (its statistic: the mean, a sum, or ``asr``,
a share of successes) over the units of the rows ``of`` names (a key left out or null: any
value), or its difference or ratio (``by``) to the rows ``to`` names (``of`` with those
keys changed). Its units are what repeats, by the claim's **kind**:

- ``attack`` (a victim metric): the victims, one per (case, seed, victim), a victim read on
  several rows of a side averaged over them; with several FL seeds, each seed's mean.
- ``utility`` (an FL metric: accuracy, PMM, test loss): one per FL run (case, seed), read
  from the target's FL runs (every FL seed, not only the attacked ones).
- ``attribute`` and ``study`` (RecUP-FL's attribute rows, a study's rows): the rows
  themselves, which are fixed settings (strengths, rates), not a sample: they are
  compared by a one-sided sign test across the settings, never resampled.

Both sides read the same units (the same victims or FL seeds under two settings): the
comparison is **paired**, per unit. The interval is ``report.intervals``'. ``best:
min|max`` with ``over`` picks one row of each side, the table's smallest or largest value
among the rows that keep the bounds; the pick is made again in each of ``PICKS``
resamples of the rows' units, and where it moves, the interval spans each pick's that a
resample makes at least 2.5 % of the time.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import pandas as pd

from gradleak.report import intervals
from gradleak.report.matched_loss import at_loss, at_loss_within
from gradleak.report.reference import matching
from gradleak.report.tables import SUCCESS_SSIM
from gradleak.settings import UNDEFENDED
from gradleak.utils.keys import Family, same
from gradleak.utils.metric_kinds import FL_METRICS, kind_of, statistic

MEASURED_COLUMNS = ["claim", "ours", "ci_low", "ci_high", "method", "n_of", "n_to",
                    "units_of", "units_to", "seeds_of", "seeds_to", "paired", "rows", "attacks",
                    "datasets", "attributes", "unmet"]
PICKS = 1000
RARE = 0.025  # a pick made less often than this is not the interval's


def _where(source: pd.DataFrame, where: Mapping) -> pd.DataFrame:
    keep = [source[k].map(lambda v, w=w: same(v, w)).to_numpy(dtype=bool)
            for k, w in where.items() if k in source]
    return source[np.logical_and.reduce(keep)] if keep else source


def _value_column(rows: pd.DataFrame, metric: str, over: str) -> pd.Series:
    column = "ssim" if metric == "asr" else metric.partition(":")[0]
    values = rows[column].astype(float) if column in rows else pd.Series(np.nan, rows.index)
    if metric == "asr":
        return (values > SUCCESS_SSIM).astype(float).where(values.notna())
    if over == "successes" and column not in FL_METRICS and "ssim" in rows:
        return values.where(rows["ssim"] > SUCCESS_SSIM)
    return values


def units(source: pd.DataFrame, where: Mapping, keys: list[str], metric: str, kind: str,
          over: str = "all", free: list[str] | None = None) -> pd.DataFrame:
    """A side's units: ``unit`` (what pairs it with the other side's: for fixed settings
    their ``free`` keys, those neither side names), ``seed`` and ``value`` (the metric as
    its statistic counts it), with the ``attack`` (or adversary) and ``dataset`` read."""
    rows = _where(source, where)
    if kind == "utility":  # one unit per FL run, whatever the victims attacked there
        rows = rows.drop_duplicates([c for c in ("case", "seed", *keys) if c in rows])
    values = _value_column(rows, metric, over)
    frame = pd.DataFrame({"value": values.to_numpy(),
                          "seed": (rows["seed"] if "seed" in rows else 0),
                          "case": rows["case"] if "case" in rows else "",
                          "attack": rows.get("attack", rows.get("adversary", "")),
                          "dataset": rows["dataset"] if "dataset" in rows else "",
                          "attribute": rows["attribute"] if "attribute" in rows else "",
                          "uploads": rows["uploads"] if "uploads" in rows else np.nan},
                         index=rows.index)
    if kind in ("attribute", "study"):  # a row per fixed setting, named by its free keys
        frame["unit"] = _joined(rows, free if free is not None else keys)
        return frame.reset_index(drop=True)
    frame["unit"] = _joined(rows, ["case", "seed"] + (["victim"] if kind == "attack" else []))
    return (frame.groupby("unit", sort=True)
            .agg(value=("value", "mean"), seed=("seed", "first"), case=("case", "first"),
                 attack=("attack", lambda a: ";".join(sorted(set(map(str, a))))),
                 dataset=("dataset", lambda d: ";".join(sorted(set(map(str, d))))))
            .reset_index())


def _matched(source: pd.DataFrame, option: list[Mapping], claim: Mapping, free: list[str],
             of_units: pd.DataFrame) -> pd.DataFrame:
    """The ``to`` side at the ``of`` side's learning loss (``matched: learning_loss``): per
    fixed setting (``of_units``' units), the ``to`` defense's curve over all its strengths
    (its labels' ``Family``) and the undefended rows (its start), at the loss the ``of``
    row reached; NaN where the curve does not span it (``matched_loss.at_loss``). With
    ``matched_within``, its points that close to that loss count too, the one least
    favourable to the claim read (``matched_loss.at_loss_within``)."""
    metric, within = claim["metric"], claim.get("matched_within")
    pick = min if "<" in claim["expect"] else max  # the baseline hardest to beat
    family = Family(option[1]["defense"])
    curve = {**{k: v for k, v in option[1].items() if k != "strength"}, "defense": family}
    rows = pd.concat([_where(source, curve),
                      _where(source, {**curve, "defense": family.undefended(UNDEFENDED)})])
    rows = rows.drop_duplicates().assign(unit=lambda f: _joined(f, free),
                                         value=lambda f: _value_column(f, metric, "all"))
    own = _where(source, option[0])
    loss = own.assign(unit=_joined(own, free)).groupby("unit")["learning_loss"].mean()
    points = rows.groupby(["unit", "defense", "strength"])[["learning_loss", "value"]].mean()

    def value(unit: str) -> float:
        if unit not in loss or unit not in points.index.get_level_values("unit"):
            return np.nan
        curve = points.loc[unit]
        if within is not None:
            return at_loss_within(loss[unit], curve["learning_loss"], curve["value"], within,
                                  pick)
        return at_loss(loss[unit], curve["learning_loss"], curve["value"])

    matched = of_units.assign(value=of_units["unit"].map(value).astype(float), uploads=np.nan)
    spans = points["learning_loss"].groupby(level="unit").agg(["min", "max"])
    if matched["value"].isna().all() and len(loss) and len(spans):
        matched.attrs["unmatched"] = (
            f"learning_loss {_span(loss.min(), loss.max())} outside"
            f"{f' {within:g} of' if within else ''} the "
            f"{str(option[1]['defense']).split('~')[0]} curve's span "
            f"{_span(spans['min'].min(), spans['max'].max())}: no value at the same loss on "
            f"any of {len(matched)} units")
    return matched


def _span(low: float, high: float) -> str:
    """``low``-``high`` in 5 digits, one number where they are equal there."""
    return f"{low:.5g}" if f"{low:.5g}" == f"{high:.5g}" else f"{low:.5g}-{high:.5g}"


def _joined(rows: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Each row's values of ``columns`` (those it has) as one text: "case|0|3"."""
    present = [c for c in columns if c in rows]
    if rows.empty or not present:
        return pd.Series("", index=rows.index, dtype=str)
    return rows[present].astype(str).agg("|".join, axis=1)


def _by_seed(side: pd.DataFrame) -> pd.DataFrame:
    """Each FL run's mean over its victims, where a side's victims come from several."""
    if side["seed"].nunique() < 2:
        return side
    return side.groupby(["case", "seed"], sort=True).agg(
        value=("value", "mean"), attack=("attack", "first"),
        dataset=("dataset", "first")).reset_index().assign(
        unit=lambda f: f["case"].astype(str) + "|" + f["seed"].astype(str))


def sign_counts(values: np.ndarray, expect: Mapping) -> tuple[int, int]:
    """(settings on the claim's side, settings that decide) across fixed settings: a sign
    test's counts (``report.verdicts.sign_verdict``). A bound's side excludes ties with it;
    a band's is inside it."""
    v = values[np.isfinite(values)]
    if "between" in expect:
        low, high = expect["between"]
        return int(((v >= low) & (v <= high)).sum()), len(v)
    (op, bound), = expect.items()
    v = v[v != bound]
    return int((v < bound).sum() if op == "<" else (v > bound).sum()), len(v)


def _settings(sides: list[pd.DataFrame], claim: Mapping) -> intervals.Interval:
    """Across fixed settings (each unit's rows averaged over FL seeds): the mean of the
    quantity, and with ``expect`` the sign test's counts as the method ("sign k/n"); a
    regime entry's attribute ASR with Wilson's interval of its uploads pooled
    (``intervals.pooled_rate``)."""
    if "expect" not in claim and claim["metric"] == "attribute_asr" and len(sides) == 1:
        return intervals.pooled_rate(sides[0]["value"], sides[0]["uploads"])
    sides = [s.groupby("unit", sort=True)["value"].mean().reset_index() for s in sides]
    if len(sides) == 1:
        quantity = sides[0]["value"].to_numpy()
    else:
        both = sides[0].merge(sides[1], on="unit", suffixes=("", "_to"))
        a, b = both["value"].to_numpy(), both["value_to"].to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            quantity = a / b if claim.get("by") == "ratio" else a - b
    ours = float(np.nanmean(quantity)) if np.isfinite(quantity).any() else np.nan
    if "expect" not in claim:  # a regime entry: its mean alone
        return intervals.Interval.none(ours)
    on, n = sign_counts(quantity, claim["expect"])
    return intervals.Interval(ours, np.nan, np.nan, f"sign {on}/{n}")


def _contrast(sides: list[pd.DataFrame], claim: Mapping, kind: str) -> tuple:
    """(interval, paired) of the claim's quantity from its sides' units."""
    stat, by = statistic(claim["metric"]), claim.get("by", "difference")
    if kind in ("attribute", "study"):
        return _settings(sides, claim), len(sides) == 2
    sides = [_by_seed(s) for s in sides]
    if len(sides) == 1:
        values = sides[0]["value"].to_numpy()
        made = (intervals.rate if stat == "asr" else intervals.mean)(values)
        if stat == "sum":
            n = np.isfinite(values).sum()
            made = intervals.Interval(made.estimate * n, made.low * n, made.high * n, made.method)
        return made, False
    a, b = sides
    paired = set(a["unit"]) == set(b["unit"]) and len(a) == len(b)
    if paired:
        joined = a.merge(b, on="unit", suffixes=("", "_to"))
        va, vb = joined["value"].to_numpy(), joined["value_to"].to_numpy()
    else:
        va, vb = a["value"].to_numpy(), b["value"].to_numpy()
    if stat == "asr" and not (a["seed"].nunique() > 1):
        return intervals.rate_difference(va, vb, paired), paired
    made = intervals.contrast(va, vb, by, paired)
    if stat == "sum" and by == "ratio":  # sums over the sides' units: means x counts
        counts = np.isfinite(va).sum(), np.isfinite(vb).sum()
        scale = counts[0] / counts[1] if counts[1] else np.nan
        made = intervals.Interval(made.estimate * scale, made.low * scale, made.high * scale,
                                  made.method)
    return made, paired


def _candidates(table: pd.DataFrame, keys: list[str], where: Mapping, claim: Mapping
                ) -> pd.DataFrame:
    """The table rows a ``best`` pick chooses among: ``where``'s (null: any)."""
    rows = matching(table, {k: v for k, v in where.items() if v is not None})
    return rows.dropna(subset=[claim["metric"]]).drop_duplicates(keys)


def _pick(means: pd.DataFrame, claim: Mapping) -> int | None:
    """The position (in ``means``) of the row ``best`` picks among those keeping ``over``."""
    keep = np.ones(len(means), dtype=bool)
    for column, bound in claim.get("over", {}).items():
        (op, b), = bound.items()
        keep &= (means[column] > b) if op == ">" else (means[column] < b)
    if not keep.any():
        return None
    metric = means[claim["metric"]].where(keep)
    return int(np.nanargmax(metric) if claim["best"] == "max" else np.nanargmin(metric))


def _picks(table, frames, keys, where, claim, kind, over) -> tuple[list[dict], dict]:
    """The rows a side's ``best`` picks: the table's pick first, then every other row a
    resample picks at least ``RARE`` of the time, with how often each is picked."""
    rows = _candidates(table, keys, where, claim)
    first = _pick(rows.reset_index(drop=True), claim)
    if first is None:
        return [], {}
    metrics = [claim["metric"], *claim.get("over", {})]
    rng = np.random.default_rng(intervals.SEED)
    drawn = {m: [] for m in metrics}
    for _, row in rows.iterrows():
        for m in metrics:
            each = kind_of(m) if kind != "study" else kind
            u = units(frames(each), row[keys].to_dict(), keys, m, each, over)["value"].to_numpy()
            u = u[np.isfinite(u)]
            drawn[m].append(u[rng.integers(0, len(u), (PICKS, len(u)))].mean(1) if len(u)
                            else np.full(PICKS, np.nan))
    counts = np.zeros(len(rows))
    for b in range(PICKS):
        picked = _pick(pd.DataFrame({m: [d[b] for d in drawn[m]] for m in metrics}), claim)
        if picked is not None:
            counts[picked] += 1
    share = counts / PICKS
    order = [first] + [i for i in np.argsort(-share, kind="stable") if i != first
                       and share[i] >= RARE]
    picked = [rows.iloc[i][keys].to_dict() for i in order]
    return picked, {_text(p): float(share[i]) for p, i in zip(picked, order)}


def _text(row: Mapping) -> str:
    return ", ".join(f"{k} {v}" for k, v in row.items())


def measure(claim: Mapping, spec: Mapping, table: pd.DataFrame, source: pd.DataFrame,
            study: bool = False, fl: pd.DataFrame | None = None) -> dict:
    """One claim's (or regime entry's) row of ``MEASURED_COLUMNS`` from its target's
    ``table`` and the frame the table was aggregated from (``source``); a utility metric
    is read from the FL runs (``fl``: one row per run of every FL seed) where given."""
    keys = [*spec["rows"], *spec.get("columns", [])]
    over = claim.get("counted", spec.get("over", "all"))
    kind = kind_of(claim["metric"], study)

    def frames(of_kind: str) -> pd.DataFrame:
        return fl if of_kind == "utility" and fl is not None and not fl.empty else source

    wheres = [dict(claim["of"])] + ([{**claim["of"], **claim["to"]}] if "to" in claim else [])
    row = {"claim": claim["id"], "ours": np.nan, "ci_low": np.nan, "ci_high": np.nan,
           "method": "", "n_of": 0, "n_to": 0, "units_of": 0, "units_to": 0, "seeds_of": 0,
           "seeds_to": 0, "paired": False,
           "rows": "", "attacks": "", "datasets": "", "attributes": "", "unmet": ""}
    if "best" in claim:
        picks = [_picks(table, frames, keys, w, claim, kind, over) for w in wheres]
        if not all(p for p, _ in picks):
            bounds = " and ".join(f"{c} {op} {b:g}" for c, bound in claim["over"].items()
                                  for op, b in bound.items())
            return {**row, "unmet": f"no row of {claim['target']} keeps {bounds}"}
        options = list(itertools.product(*(p for p, _ in picks)))
        row["rows"] = " / ".join("; ".join(f"{r} ({share:.0%})" for r, share in shares.items())
                                 for _, shares in picks)
    else:
        options = [[{k: v for k, v in w.items() if v is not None} for w in wheres]]
        row["rows"] = " / ".join(_text(w) or "every row" for w in options[0])
    fixed = {k for w in wheres for k, v in w.items() if v is not None}
    free = [k for k in keys if k not in fixed]
    made = []
    for option in options:
        sides = [units(frames(kind), w, keys, claim["metric"], kind, over, free)
                 for w in option]
        if claim.get("matched"):
            sides[1] = _matched(frames(kind), option, claim, free, sides[0])
        made.append((sides, *_contrast(sides, claim, kind)))
    sides, first, paired = made[0]
    counts = [int(s["value"].notna().sum()) for s in sides]
    row.update({
        "ours": first.estimate, "ci_low": min(m.low for _, m, _ in made),
        "ci_high": max(m.high for _, m, _ in made), "method": first.method,
        "n_of": counts[0], "n_to": counts[1] if len(counts) > 1 else 0,
        "units_of": len(sides[0]), "units_to": len(sides[1]) if len(sides) > 1 else 0,
        "seeds_of": int(sides[0]["seed"].nunique()),
        "seeds_to": int(sides[1]["seed"].nunique()) if len(sides) > 1 else 0,
        "paired": paired,
        "attacks": ";".join(sorted({a for s in sides for each in s["attack"].astype(str)
                                    for a in each.split(";") if a})),
        "datasets": ";".join(sorted({d for s in sides for each in s["dataset"].astype(str)
                                     for d in each.split(";") if d})),
        "attributes": ";".join(sorted({a for s in sides
                                       for a in s.get("attribute", pd.Series()).astype(str)
                                       if a}))})
    unmet = _unmeasured(claim, sides, counts, first)
    if "same_utility" in claim:
        unmet += _utility_apart(claim["same_utility"], frames("utility"), options[0])
    row["unmet"] = "; ".join(unmet)
    return row


def _utility_apart(same_utility: Mapping, fl: pd.DataFrame, option: list[Mapping]) -> list[str]:
    """Why the two sides are not at the same utility (``same_utility``: their FL runs'
    ``metric``, mean over seeds, at most ``within`` apart; RecUP-FL §6.3 tunes each defense
    to "a similar level of learning loss"); empty where they are."""
    metric, within = same_utility["metric"], same_utility["within"]
    values = [_where(fl, side)[metric].astype(float).mean() if metric in fl else np.nan
              for side in option]
    if not all(np.isfinite(values)):
        return [f"{metric} of the FL runs not measured a side: the same utility unchecked"]
    if abs(values[0] - values[1]) > within:
        return [f"{metric} {values[0]:.4g} against {values[1]:.4g}: more than {within:g} "
                f"apart, not at the same utility"]
    return []


def _unmeasured(claim: Mapping, sides: list[pd.DataFrame], counts: list[int],
                made: intervals.Interval) -> list[str]:
    """Why the measurement cannot decide the claim, whatever the regime."""
    names = ("of", "to")
    for i, side in enumerate(sides):
        if side.empty:
            rows = {k: v for k, v in ({**claim["of"], **claim.get("to", {})} if i else
                                      claim["of"]).items() if v is not None}
            return [f"not run: no row of {claim['target']} with {rows or 'any keys'}"]
        if not counts[i]:
            return [side.attrs.get("unmatched") or f"{claim['metric']} not measured on "
                    f"{names[i]} (NaN on all {len(side)} units)"]
    if made.method.startswith("sign") or np.isfinite(made.low):
        return []
    return ["fewer than 2 units" if min(counts) < 2 else
            f"no spread among {min(counts)} units: no interval"]


def measure_all(claims: list[Mapping], spec: Mapping, table: pd.DataFrame,
                source: pd.DataFrame, study: bool = False,
                fl: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`measure` for every claim, as a frame of ``MEASURED_COLUMNS``."""
    return pd.DataFrame([measure(c, spec, table, source, study, fl) for c in claims],
                        columns=MEASURED_COLUMNS)
