"""The rows a configuration's claims read (decision 0105): at ``scale: reduced`` the plan is
these rows only, not every target's grid.

A claim reads the rows of its target that ``of`` names and, with ``to``, those of ``of``
with ``to``'s keys changed; a regime entry (``regime.reconstructs``, ``regime.learns``) the
undefended rows it names, where a claim that is planned may require it (an attack claim: an
entry of an attack its rows may run). A claim that
``left_out`` names reads nothing. A point of a
target is kept when its keys match some read row on every key the row names (a null key:
any value; a key the point does not carry, such as a seed, matches), and it keeps the
attack labels those rows name (every one, where none names ``attack``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from gradleak.settings import UNDEFENDED
from gradleak.utils.keys import Family, same
from gradleak.utils.metric_kinds import kind_of, reads_fl


def entries(config: Mapping) -> list[Mapping]:
    """The regime's entries, reconstructs then learns."""
    regime = config.get("regime", {})
    return [*regime.get("reconstructs", []), *regime.get("learns", [])]


def planned_claims(config: Mapping) -> list[Mapping]:
    """The claims that ``left_out`` does not name."""
    return [c for c in config["claims"] if c["id"] not in config.get("left_out", {})]


def attacks_named(config: Mapping, claim: Mapping) -> set[str]:
    """The attack labels a claim's rows may run: those its sides name, else every one its
    target's selections run."""
    named = {side["attack"] for side in (claim["of"], claim.get("to", {}))
             if side.get("attack") is not None}
    return named or {attack for selection in config["targets"][claim["target"]].get("select", [])
                     for attack in selection.get("attacks", config["attacks"])}


def required_entries(config: Mapping) -> list[Mapping]:
    """The regime entries some planned claim may require (``report.verdicts``): those its
    ``requires`` names, else the entries of the part its kind reads (``reconstructs``: an
    attack claim's entries of the attacks it may read, every entry for an attribute claim;
    ``learns``: a utility claim, or one picking rows by an FL metric), on the datasets its
    target selects."""
    regime, names = config.get("regime", {}), set()
    for claim in planned_claims(config):
        if claim["target"] not in config["targets"]:
            continue  # a narrowed configuration (one target's estimate)
        study = "study" in config["targets"][claim["target"]]
        on = _target_datasets(config["targets"][claim["target"]])
        kind = kind_of(claim["metric"], study)
        parts = {"reconstructs": kind in ("attack", "attribute"), "learns": reads_fl(claim, study)}
        for part in (p for p, read in parts.items() if read):
            named = claim.get("requires", {}).get(part)
            if named is not None:
                names |= set(named)
                continue
            read = attacks_named(config, claim) if kind == "attack" and part == "reconstructs" \
                else None
            names |= {e["id"] for e in regime.get(part, [])
                      if (read is None or set(e.get("attacks", [])) & read)
                      and (on is None or not e.get("datasets") or set(e["datasets"]) & on)}
    return [e for e in entries(config) if e["id"] in names]


def _target_datasets(target: Mapping) -> set[str] | None:
    """The datasets a target's selections name (None: a study, or a selection of any)."""
    names: set[str] = set()
    for selection in target.get("select") or [None]:
        if not selection or not selection.get("datasets"):
            return None
        names |= set(selection["datasets"])
    return names


def read_rows(config: Mapping) -> dict[str, list[dict]]:
    """Target -> the rows (key values; null: any) its planned claims and the regime entries
    they may require read."""
    rows: dict[str, list[dict]] = {}
    for claim in planned_claims(config):
        sides = [claim["of"]] + ([{**claim["of"], **claim["to"]}] if "to" in claim else [])
        if "matched" in claim:  # to's defense over all its strengths, from the undefended run
            family = Family(sides[1]["defense"])
            curve = {**sides[1], "strength": None, "defense": family}
            sides += [curve, {**curve, "defense": family.undefended(UNDEFENDED)}]
        rows.setdefault(claim["target"], []).extend(dict(side) for side in sides)
    for entry in required_entries(config):
        rows.setdefault(entry["target"], []).append(dict(entry["of"]))
    return rows


def by_claims(config: Mapping) -> bool:
    """Whether the plan is the claims' rows: at the reduced scale, with claims."""
    return config.get("scale") == "reduced" and bool(config["claims"])


def _matches(keys: Mapping[str, Any], row: Mapping) -> bool:
    return all(value is None or key not in keys or same(keys[key], value)
               for key, value in row.items() if key != "attack")


def kept(config: Mapping, points: Iterable, keys: Callable[[Any], Mapping],
         rows: Mapping[str, list[dict]] | None = None) -> list:
    """The ``points`` (``plan.Point``) that the claims' rows (or ``rows``: target -> rows)
    read, each with the attack labels they name; ``keys(point)``: a point's table keys."""
    rows = read_rows(config) if rows is None else rows
    out = []
    for point in points:
        matched = [row for row in rows.get(point.target, []) if _matches(keys(point), row)]
        if not matched:
            continue
        named = {row["attack"] for row in matched if row.get("attack") is not None}
        every = any(row.get("attack") is None for row in matched)
        attacks = point.attacks if every else tuple(a for a in point.attacks if a in named)
        if attacks or not point.attacks:
            out.append(replace(point, attacks=attacks))
    return out
