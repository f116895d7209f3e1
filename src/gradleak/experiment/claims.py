"""A configuration's claims before any job (decision 0105): their rules against the
targets, what its scale cannot decide by construction, on which data and at which scale.

``construction`` lists, per claim, why the plan itself leaves it untestable, whatever the
runs show: the smoke scale (stand-ins and budgets that test the wiring); a claim that
``left_out`` names (its run does not fit the scale's budget); a target, or rows of it, not
planned; fewer FL seeds than a claim on utility needs; an attack the claim reads whose
iterations the scale cut below the full configuration's (the paper's), unless the regime
entry covering it states a budget a measured curve justifies (``converged``; decision
0110). ``gradleak validate`` and ``snakemake -n`` print them, one line each.
``judged_regime`` is the regime the verdicts apply: a budget justified by the paper's
value needs that value less ``PAPER_MARGIN`` dB, not only the entry's floor.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from gradleak import attacks
from gradleak import config as cfg
from gradleak.config import ConfigError
from gradleak.experiment import claim_rows, plan
from gradleak.utils.metric_kinds import kind_of, seeds_a_side, statistic

PAPER_MARGIN = 1.0  # dB: a cut budget justified by the paper's value reaches it less this

UNIT_METRICS = ("asr", "ssim", "ssim_best", "accuracy", "attribute_asr")  # shares in [0, 1]


def _table_keys(config: dict, target: str, where: str) -> tuple[dict, list[str]]:
    table = config["targets"].get(target, {}).get("table")
    if table is None:
        tables = sorted(n for n, t in config["targets"].items() if "table" in t)
        raise ConfigError(f"{where}: 'target' {target!r} is not a target with a table "
                          f"(expected one of {tables})")
    return table, [*table["rows"], *table.get("columns", [])]


def _check_rows(config: dict, item: Mapping, where: str, parts: tuple[str, ...],
                full: dict) -> None:
    table, keys = _table_keys(config, item["target"], where)
    if item["metric"] not in table["metrics"]:
        raise ConfigError(f"{where}: 'metric' {item['metric']!r} is not a metric of "
                          f"{item['target']}'s table (expected one of {table['metrics']})")
    for part in parts:
        unknown = sorted(set(item.get(part, {})) - set(keys)
                         - (set(table["metrics"]) if part == "over" else set()))
        if unknown:
            raise ConfigError(f"{where}: '{part}' names {unknown[0]!r}; expected keys of "
                              f"{item['target']}'s table {keys}")
    if item["target"] in full["targets"] and "study" not in full["targets"][item["target"]]:
        _check_values(full, item, where)


def full_config(config: dict) -> dict:
    """``config`` with its scale's overrides undone (``full_scale``'s values restored): the
    grid a claim's rows must exist in, whatever this scale plans of it."""
    if not config["full_scale"]:
        return config
    full = copy.deepcopy(config)
    for path, value in config["full_scale"].items():
        if value is None:
            parent, _, key = path.rpartition(".")
            (cfg.get_path(full, parent) if parent else full).pop(key, None)
        else:
            cfg.set_path(full, path, copy.deepcopy(value))
    return full


def _check_values(config: dict, item: Mapping, where: str) -> None:
    """Each side's rows exist in its target's grid (the keys its points carry, and the
    attack labels they run), before any job."""
    points = plan.target_points(config, item["target"])
    rows = [(p, plan.point_keys(config, p)) for p in points]
    for part, side in zip(("of", "to"), _sides(item)):
        if any(claim_rows.kept(config, [p], lambda _, k=k: k, {item["target"]: [side]})
               for p, k in rows):
            continue
        for key, value in side.items():
            have = sorted({str(a) for p, k in rows
                           for a in (p.attacks if key == "attack" else [k.get(key)])
                           if key == "attack" or key in k}, key=str)
            if value is not None and have and not any(v == str(value) or (
                    isinstance(value, (int, float)) and _number(v) == value) for v in have):
                raise ConfigError(f"{where}: '{part}' {{{key}: {value!r}}} is no row of "
                                  f"{item['target']} (its {key} values: {have})")
        raise ConfigError(f"{where}: '{part}' {_shown(side)} matches no row of "
                          f"{item['target']}; expected values its selections plan")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def validate(config: dict) -> None:
    """Each claim and regime entry reads a target with a table, one of its metrics and its
    row keys; ids are unique; a claim's ``requires`` names regime entries; a rate is
    compared by its difference; ``left_out`` names claims."""
    seen: set[str] = set()
    regime, full = config["regime"], full_config(config)
    for part in ("reconstructs", "learns"):
        for i, entry in enumerate(regime[part]):
            where = f"invalid config: 'regime.{part}[{i}]' ({entry['id']})"
            if entry["id"] in seen:
                raise ConfigError(f"{where}: the id is used twice; expected unique ids")
            seen.add(entry["id"])
            _check_rows(config, entry, where, ("of",), full)
            if entry.get("converged", {}).get("basis") == "paper_value" and (
                    entry.get("paper") is None or "floor" not in entry):
                raise ConfigError(f"{where}: 'converged.basis' paper_value needs the paper's "
                                  f"value and a floor; expected both")
            if "above_chance" in entry and entry["metric"] != "attribute_asr":
                raise ConfigError(f"{where}: 'above_chance' on {entry['metric']}; expected it "
                                  f"only on attribute_asr")
            bound = entry.get("floor", entry.get("ceiling"))
            if entry["metric"].partition(":")[0] in UNIT_METRICS and not 0 <= bound <= 1:
                raise ConfigError(f"{where}: a bound of {bound:g} on {entry['metric']}, a "
                                  f"share; expected one in [0, 1]")
    for i, claim in enumerate(config["claims"]):
        where = f"invalid config: 'claims[{i}]' ({claim['id']})"
        if claim["id"] in seen:
            raise ConfigError(f"{where}: the id is used twice; expected unique ids among the "
                              f"claims and regime entries")
        seen.add(claim["id"])
        _check_rows(config, claim, where, ("of", "to", "over"), full)
        if "matched" in claim and kind_of(claim["metric"]) != "attribute":
            raise ConfigError(f"{where}: 'matched' on {claim['metric']}; expected an attribute "
                              f"metric (an adversary's ASR against a defense's curve)")
        if "matched_within" in claim and not any(k in claim["expect"] for k in "<>"):
            raise ConfigError(f"{where}: 'matched_within' with expect {claim['expect']}; "
                              f"expected '<' or '>' (which side the claim must beat)")
        if statistic(claim["metric"]) == "asr" and claim["by"] == "ratio":
            raise ConfigError(f"{where}: 'by' ratio of a rate (asr); expected difference")
        low, high = claim["expect"].get("between", (0, 0))
        if low > high:
            raise ConfigError(f"{where}: 'expect.between' [{low:g}, {high:g}] has its ends "
                              f"reversed; expected [low, high]")
        for part in ("reconstructs", "learns"):
            for name in claim.get("requires", {}).get(part, []):
                ids = [e["id"] for e in regime[part]]
                if name not in ids:
                    raise ConfigError(f"{where}: 'requires.{part}' names {name!r}; expected "
                                      f"one of regime.{part}'s ids {ids}")
        _check_required_attacks(full, claim, where)
    claims = {c["id"] for c in config["claims"]}
    for name in config["left_out"]:
        if name not in claims:
            raise ConfigError(f"invalid config: 'left_out.{name}': not a claim's id (expected "
                              f"one of {sorted(claims)})")


def _check_required_attacks(full: dict, claim: Mapping, where: str) -> None:
    """The ``requires.reconstructs`` entries of a claim are the regime of its case: each
    covers a dataset of the claim's rows (an entry without ``datasets``: every one). Not
    only its own attacks' entries: a claim that an attack fails (GIAS Fig. 6, the wrong
    prior) requires that the case's other attacks reconstruct, not the failing one."""
    names = claim.get("requires", {}).get("reconstructs", [])
    if not names or "study" in full["targets"].get(claim["target"], {}):
        return
    points = read_points(full, claim, plan.target_points(full, claim["target"]), _sides(claim))
    datasets = {str(plan.point_keys(full, p).get("dataset")) for p in points}
    for entry in full["regime"]["reconstructs"]:
        covered = entry.get("datasets")
        if entry["id"] in names and points and covered and not set(covered) & datasets:
            raise ConfigError(f"{where}: 'requires.reconstructs' names {entry['id']!r}, the "
                              f"regime on {covered}, but the claim's rows are on "
                              f"{sorted(datasets)}; expected an entry of their datasets")


def _budget(label: str, params: Mapping) -> int:
    """Gradient-matching iterations of a victim over its restarts (``Attack.budget`` x
    ``restarts``)."""
    name = params.get("attack", label)
    own = cfg.resolve("attacks", name, {k: v for k, v in params.items() if k != "attack"})
    return attacks.base.registered(name).budget(own) * own.get("restarts", 1)


def _full_params(config: dict, label: str) -> dict:
    """An attack label's parameters at the full scale (``full_scale``'s values restored)."""
    params = copy.deepcopy(config["attacks"][label])
    prefix = f"attacks.{label}."
    for path, value in config["full_scale"].items():
        if path.startswith(prefix) and value is not None:
            cfg.set_path(params, path[len(prefix):], value)
    return params


def _sides(claim: Mapping) -> list[dict]:
    return [claim["of"]] + ([{**claim["of"], **claim["to"]}] if "to" in claim else [])


def read_points(config: dict, claim: Mapping, points: list | None = None,
                sides: list[dict] | None = None) -> list:
    """The planned points (``plan.points``, or ``points``) whose rows the claim reads (or
    only ``sides`` of them)."""
    points = plan.points(config) if points is None else points
    return claim_rows.kept(config, [p for p in points if p.target == claim["target"]],
                           lambda p: plan.point_keys(config, p),
                           {claim["target"]: sides or _sides(claim)})


def _shown(side: Mapping) -> str:
    return str({k: v for k, v in side.items() if v is not None} or "any keys")


def attacks_read(config: dict, claim: Mapping, points: list | None = None) -> set[str]:
    """The attack labels the claim's planned rows run."""
    return {a for p in read_points(config, claim, points) for a in p.attacks}


def construction(config: dict) -> dict[str, list[str]]:
    """Claim id -> why the plan cannot decide it (empty where it may)."""
    out: dict[str, list[str]] = {}
    planned, studies = set(plan.targets(config)), set(plan.studies(config))
    points = plan.points(config)
    regime = config["regime"]
    for claim in config["claims"]:
        reasons = []
        if config["scale"] == "smoke":
            reasons.append("smoke scale: stand-ins and budgets that test the wiring")
        if claim["id"] in config["left_out"]:  # nothing of it is planned
            out[claim["id"]] = [*reasons, f"left out at this scale: "
                                          f"{config['left_out'][claim['id']]}"]
            continue
        if claim["target"] not in planned:
            reasons.append(f"target {claim['target']} is not planned at this scale")
        elif claim["target"] not in studies:
            reasons += [f"no row of {claim['target']} with {_shown(side)} is planned"
                        for side in _sides(claim)
                        if not read_points(config, claim, points, [side])]
        kind = kind_of(claim["metric"], claim["target"] in studies)
        seeds = claim.get("requires", {}).get("seeds", regime["seeds"])
        if seeds_a_side(claim, claim["target"] in studies) and len(config["fl"]["seeds"]) < seeds:
            reasons.append(f"{len(config['fl']['seeds'])} FL seed"
                           f"{'s' * (len(config['fl']['seeds']) != 1)} planned "
                           f"(fl.seeds {config['fl']['seeds']}); the claim needs {seeds}")
        if kind == "attack" and claim["target"] in planned:
            reasons += _cut_budgets(config, claim, points)
        out[claim["id"]] = reasons
    return out


def _cut_budgets(config: dict, claim: Mapping, points: list) -> list[str]:
    """The attacks of the claim's rows whose iterations (over a victim's restarts) the scale
    cut below the full configuration's, without a convergence curve that justifies it."""
    out = []
    for label in sorted(attacks_read(config, claim, points)):
        ours, full = _budgets(config, label)
        justified = [e["converged"]["iterations"] for e in config["regime"]["reconstructs"]
                     if label in e["attacks"] and "converged" in e]
        if ours < full and not (justified and ours >= min(justified)):
            out.append(f"{label} runs {ours} of the paper's {full} iterations")
    return out


def _budgets(config: dict, label: str) -> tuple[int, int]:
    """The attack's iterations over a victim's restarts at this scale and in full."""
    return _budget(label, config["attacks"][label]), _budget(label, _full_params(config, label))


def judged_regime(config: dict) -> dict:
    """The regime the verdicts apply: an entry whose attack this scale cuts to a budget
    justified by the paper's value (``converged.basis: paper_value``) is in regime at the
    paper's value less ``PAPER_MARGIN`` (or its floor, where higher)."""
    regime = copy.deepcopy(config["regime"])
    for entry in regime["reconstructs"]:
        basis = entry.get("converged", {}).get("basis")
        cut = [ours < full for ours, full in (_budgets(config, a) for a in entry["attacks"]
                                              if a in config["attacks"])]
        if basis == "paper_value" and any(cut):
            entry["floor"] = max(entry["floor"], entry["paper"] - PAPER_MARGIN)
    return regime


def untestable_lines(config: dict) -> list[str]:
    """One line per claim the plan cannot decide, naming why."""
    return [f"claim {name} is untestable at scale {config['scale']}: {'; '.join(reasons)}"
            for name, reasons in construction(config).items() if reasons]


def claim_data(config: dict) -> dict[str, str]:
    """Per claim: ``stand-in`` where a dataset it reads (its rows' ``dataset``, else its
    target's) is a stand-in (for a target without cases, a study: at a scale but full),
    else ``paper``."""
    datasets: dict[str, set] = {}
    for point in plan.points(config):
        datasets.setdefault(point.target, set()).add(
            plan.find_case(config, point.case)["dataset"])
    data = {}
    for claim in config["claims"]:
        named = {claim[side]["dataset"] for side in ("of", "to")
                 if claim.get(side, {}).get("dataset") is not None}
        read = named or datasets.get(claim["target"])
        stand_in = any(config["datasets"].get(d, {}).get("stand_in") for d in read) \
            if read else config["scale"] != "full"
        data[claim["id"]] = "stand-in" if stand_in else "paper"
    return data


def scale_conditions(config: dict) -> str:
    """What the configuration's scale changes from its full form: each leaf of its
    ``<scale>_overrides`` as ``path=value`` (a target's own selection: ``targets.<t>``),
    and at the reduced scale that only the claims' rows are planned; joined by "; " (""
    at full scale)."""
    if config["scale"] == "full":
        return ""

    def leaves(value, path: str) -> list[str]:
        if path.startswith("targets.") and path.count(".") == 1:
            return [path]
        if isinstance(value, dict) and value:
            return [leaf for key, sub in value.items() for leaf in leaves(sub, f"{path}.{key}")]
        return [f"{path}={value}"]

    overrides = config[f"{config['scale']}_overrides"]
    out = [leaf for key, value in overrides.items() for leaf in leaves(value, key)]
    if claim_rows.by_claims(config):
        out.append("only the rows the claims and regime entries read are planned")
    return "; ".join(out)
