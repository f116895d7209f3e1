"""What a validated configuration asks for: its cases, its points (case x setting x attack
labels, per target and series), the jobs they make, and each setting's resolved
configuration.

Without ``targets`` the plan is every case x every defense point x every attack. With
targets it is the union of what their selections name: each selection's cases x defense
points x one point per combination of its sweep values (a ``paired`` path takes the value
at its strength's position instead of every value).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gradleak import config as cfg
from gradleak.data import attribute_counts
from gradleak.experiment import claim_rows
from gradleak.settings import ATTACK_ONLY_KEYS, UNDEFENDED, Setting, frozen, number_text
from gradleak.utils.metric_kinds import bar_twin

NONE = Setting(UNDEFENDED, 0)  # the undefended setting


def case_name(case: dict) -> str:
    """``dataset-model-partition-kK``, e.g. ``digits-lenet-iid-k10``, ``lfw-attribute_cnn-
    byidentity-k100`` (whole identities per client)."""
    part = case["partition"]
    if part["kind"] == "attribute":
        _check_partition_attribute(case)
    partition = {"iid": "iid", "attribute": f"by{part['attribute']}",
                 "client_dirichlet": f"clientdirichlet{number_text(part['alpha'])}"}.get(
        part["kind"], f"dirichlet{number_text(part['alpha'])}")
    return f"{case['dataset']}-{case['model']}-{partition}-k{part['clients']}"


def _check_partition_attribute(case: dict) -> None:
    """ConfigError unless the case's dataset has the attribute its partition groups by."""
    dataset, wanted = case["dataset"], case["partition"]["attribute"]
    known = sorted({*attribute_counts.CLASSES.get(dataset, {}),
                    *attribute_counts.GROUPS.get(dataset, ())})
    if wanted not in known:
        raise cfg.ConfigError(f"invalid config: case {dataset}/{case['model']} "
                              f"'partition.attribute': {wanted!r} is not an attribute of "
                              f"dataset {dataset!r}; expected one of {known} (partition kind "
                              f"'attribute' gives each client whole groups of it)")


def case_names(config: dict) -> list[str]:
    return [case_name(c) for c in config["cases"]]


def find_case(config: dict, name: str) -> dict:
    for case in config["cases"]:
        if case_name(case) == name:
            return case
    raise cfg.ConfigError(f"unknown case {name!r}; expected one of {case_names(config)}")


@dataclass(frozen=True)
class Point:
    """One case x setting that a target (None: the default plan) needs, the attack labels it
    runs there, the series it belongs to and the values its selection swept."""

    target: str | None
    series: str
    case: str
    setting: Setting
    attacks: tuple[str, ...]
    swept: tuple[tuple[str, Any], ...] = ()


def _base_value(config: dict, setting: Setting, key: str) -> Any:
    if "." in key:
        return cfg.get_path(config, key)
    return config["defenses"][setting.defense]["params"][key]


def normalize(config: dict, setting: Setting) -> Setting:
    """``setting`` without the overrides that repeat the configured value."""
    kept = {k: v for k, v in setting.overrides if frozen(_base_value(config, setting, k)) != v}
    return Setting.of(setting.defense, setting.strength, kept)


def _override(key: str, defense: str, attacks: tuple[str, ...]) -> str | None:
    """The Setting override key of a swept path for this defense and these attacks, or None
    when the path does not concern them (another defense's or attack's parameter)."""
    parts = key.split(".")
    if parts[0] == "defenses":
        return ".".join(parts[3:]) if parts[1] == defense else None
    if parts[0] == "attacks" and parts[1] not in attacks:
        return None
    return key


def _paired(selection: dict, strength: float) -> tuple[tuple[str, Any], ...]:
    """The selection's ``paired`` values that go with ``strength``: each path's value at the
    strength's position in the selection's ``strengths``."""
    paired = selection.get("paired", {})
    if not paired:
        return ()
    position = selection["strengths"].index(strength)
    return tuple((key, paired[key][position]) for key in sorted(paired))


def selected_cases(config: dict, selection: dict) -> list[dict]:
    """The configured cases a target's selection names: of its ``datasets``, ``models``,
    ``clients`` and ``partitions`` (each absent: any)."""
    datasets, models = selection.get("datasets"), selection.get("models")
    clients, partitions = selection.get("clients"), selection.get("partitions")
    return [c for c in config["cases"]
            if (datasets is None or c["dataset"] in datasets)
            and (models is None or c["model"] in models)
            and (clients is None or c["partition"]["clients"] in clients)
            and (partitions is None or c["partition"]["kind"] in partitions)]


def _selection_points(config: dict, target: str, selection: dict) -> Iterator[Point]:
    cases = [case_name(c) for c in selected_cases(config, selection)]
    defenses = selection.get("defenses", sorted(config["defenses"]))
    attacks = tuple(selection.get("attacks", sorted(config["attacks"])))
    sweep = selection.get("sweep", {})
    keys = sorted(sweep)
    for case in cases:
        for label in defenses:
            strengths = config["defenses"][label]["strengths"]
            if "strengths" in selection:
                strengths = [s for s in strengths if s in selection["strengths"]]
            for strength in strengths:
                for values in itertools.product(*(sweep[k] for k in keys)):
                    swept = tuple(zip(keys, values)) + _paired(selection, strength)
                    overrides = {_override(k, label, attacks): v for k, v in swept}
                    overrides.pop(None, None)
                    setting = normalize(config, Setting.of(label, strength, overrides))
                    yield Point(target, selection.get("series", ""), case, setting, attacks,
                                swept)


def target_order(name: str) -> tuple:
    """Tables before figures, each in the paper's numbering (table2 before table10), the
    appendix's (figa1) after the main text's."""
    kind = next((i for i, prefix in enumerate(("table", "fig")) if name.startswith(prefix)), 2)
    rest = name.removeprefix(("table", "fig", "")[kind])
    appendix = rest[:1] == "a" and rest[1:2].isdigit()
    digits = "".join(ch for ch in name if ch.isdigit())
    return kind, appendix, int(digits) if digits else 0, name


def targets(config: dict) -> list[str]:
    """The planned targets in the paper's order: at the reduced scale, those that claims
    and regime entries read (``claim_rows``)."""
    names = set(claim_rows.read_rows(config)) if claim_rows.by_claims(config) else None
    return sorted((t for t in config["targets"] if names is None or t in names),
                  key=target_order)


def point_keys(config: dict, point: Point) -> dict:
    """A point's keys as its target's table names them: case, dataset, model, defense
    (its label), strength, series and each swept value (by its path and its column)."""
    case = find_case(config, point.case)
    keys = {"case": point.case, "dataset": case["dataset"], "model": case["model"],
            "defense": point.setting.label, "strength": point.setting.strength,
            "series": point.series}
    for key, value in point.swept:
        keys[key] = keys[cfg.sweep_column(key)] = value
    return keys


def points(config: dict) -> list[Point]:
    """Every point the configuration plans, target by target (in the targets' order); at
    the reduced scale, the rows its claims read (``claim_rows``)."""
    if not config["targets"]:  # every case x defense point under each protocol
        return [Point(None, "", case, normalize(config, Setting.of(label, strength, overrides)),
                      tuple(sorted(config["attacks"])))
                for overrides in (config["protocols"] or {"": {}}).values()
                for case in case_names(config)
                for label in sorted(config["defenses"])
                for strength in config["defenses"][label]["strengths"]]
    planned = [p for name in targets(config) for p in target_points(config, name)]
    if claim_rows.by_claims(config):
        return claim_rows.kept(config, planned, lambda p: point_keys(config, p))
    return planned


def target_points(config: dict, name: str) -> list[Point]:
    """Every point of target ``name``'s selections (its whole grid, whatever the scale)."""
    return [p for selection in config["targets"][name].get("select", [])
            for p in _selection_points(config, name, selection)]


def studies(config: dict) -> list[str]:
    """The targets that are studies (a measurement without runs), in the targets' order."""
    return [name for name in targets(config) if "study" in config["targets"][name]]


_PLANNED: dict[str, dict] = {}  # a configuration's text -> its jobs (plan them once)


def jobs(config: dict) -> dict[tuple[str, Setting], tuple[str, ...]]:
    """(case, setting) -> the attack labels its attack job runs (empty: FL only)."""
    key = json.dumps(config, sort_keys=True, default=str)
    if key not in _PLANNED:
        if len(_PLANNED) > 32:
            _PLANNED.clear()
        _PLANNED[key] = _jobs(config)
    return dict(_PLANNED[key])


def _jobs(config: dict) -> dict[tuple[str, Setting], tuple[str, ...]]:
    out: dict[tuple[str, Setting], set[str]] = {}
    for point in points(config):
        out.setdefault((point.case, point.setting), set()).update(point.attacks)
    return {key: tuple(sorted(labels)) for key, labels in sorted(out.items(),
                                                                 key=lambda kv: (kv[0][0],
                                                                                 kv[0][1].text))}


def attack_jobs(config: dict) -> dict[tuple[str, Setting], tuple[str, ...]]:
    """The jobs that run at least one attack."""
    return {key: labels for key, labels in jobs(config).items() if labels}


def job_attacks(config: dict, case: str, setting: Setting) -> tuple[str, ...]:
    """The attack labels the job (case, setting) runs; ConfigError if it is not planned."""
    planned = jobs(config)
    if (case, setting) not in planned:
        raise cfg.ConfigError(f"setting {setting.text!r} of case {case!r} is not planned by this "
                              f"configuration; `gradleak plan` lists what is")
    return planned[case, setting]


def settings(config: dict) -> list[Setting]:
    """Every planned setting, sorted by its text."""
    return sorted({s for _, s in jobs(config)}, key=lambda s: s.text)


def fl_setting(setting: Setting) -> Setting:
    """The part of ``setting`` that the FL run depends on."""
    return setting.without(ATTACK_ONLY_KEYS)


def attributes(config: dict, case: str) -> list[str]:
    """The sensitive attributes the attribute track infers for ``case`` (empty: an image
    task without attributes)."""
    names = sorted(attribute_counts.CLASSES.get(find_case(config, case)["dataset"], {}))
    wanted = config["attribute"]["attributes"]
    return names if wanted is None else [a for a in wanted if a in names]


def attribute_cases(config: dict) -> list[str]:
    """The cases whose dataset has sensitive attributes (RecUP-FL's attribute tasks)."""
    return [case for case in case_names(config) if attributes(config, case)]


def attribute_jobs(config: dict) -> list[tuple[str, Setting]]:
    """(case, FL setting) pairs whose uploads the attribute adversaries attack: every
    planned setting of an attribute case whose defense label ``attribute.defenses`` names."""
    spec = config["attribute"]
    if not spec["adversaries"]:
        return []
    cases, labels = set(attribute_cases(config)), spec["defenses"]
    return sorted({(case, fl_setting(s)) for case, s in jobs(config)
                   if case in cases and (labels is None or s.defense in labels)},
                  key=lambda cs: (cs[0], cs[1].text))


def adversary_setting(setting: Setting, round_: int) -> Setting:
    """The setting whose round-``round_`` model the attribute adversaries of ``setting``
    learn under (clean gradients of the public split). At round 0 every setting of a seed
    starts from the same weights (``run_fl`` builds the model before the defense), so the
    settings that leave ``attribute.`` as configured share the undefended run's adversaries;
    after round 0 each setting's model is its own."""
    own = fl_setting(setting)
    if round_ == 0 and not any(key.startswith("attribute.") for key in own.config_overrides):
        return NONE
    return own


def adversary_jobs(config: dict) -> list[tuple[str, Setting, int]]:
    """(case, setting, round) of every model that attribute adversaries learn under."""
    return sorted({(case, adversary_setting(s, r), r) for case, s in attribute_jobs(config)
                   for r in resolve(config, s)["attribute"]["rounds"]},
                  key=lambda csr: (csr[0], csr[1].text, csr[2]))


def check_planned(planned, case: str, setting: Setting, what: str) -> None:
    """ConfigError unless (case, setting) is among the ``planned`` ones of a phase."""
    if (case, setting) not in set(planned):
        raise cfg.ConfigError(f"setting {setting.text!r} of case {case!r} has no {what} in "
                              f"this configuration; `gradleak plan` lists what is planned")


def resolve(config: dict, setting: Setting) -> dict:
    """The configuration of one setting: ``config`` with its overrides applied. The
    sections an override changes are copies; the others are ``config``'s own (read them,
    do not change them)."""
    resolved = dict(config)
    sections = {"defenses"} if setting.defense_params else set()
    sections |= {key.split(".")[0] for key in setting.config_overrides}
    for section in sections:
        resolved[section] = copy.deepcopy(config[section])
    for key, value in setting.defense_params.items():
        resolved["defenses"][setting.defense]["params"][key] = value
    for key, value in setting.config_overrides.items():
        cfg.set_path(resolved, key, value)
    return resolved


def defense_of(config: dict, setting: Setting) -> tuple[str, dict]:
    """The registered defense name and its parameters (strength knob included)."""
    name = cfg.registered_name(config, "defenses", setting.defense)
    params = dict(resolve(config, setting)["defenses"][setting.defense]["params"])
    knob = cfg.knob(name)
    if knob is not None:
        strength = setting.strength  # a float in the setting; an int for integer knobs
        if cfg.definition("defenses", name)["properties"][knob].get("type") == "integer" \
                and strength.is_integer():
            strength = int(strength)
        params[knob] = strength
    return name, params


def attack_labels(config: dict) -> list[str]:
    return sorted(config["attacks"])


def attack_of(config: dict, label: str) -> tuple[str, dict]:
    """The registered attack name of ``label`` and its parameters."""
    params = dict(config["attacks"][label])
    return params.pop("attack", label), params


def victims(config: dict, label: str) -> int:
    """How many of a setting's victims the attack ``label`` reconstructs."""
    return config["attack"]["victims"]["by_attack"].get(label, config["attack"]["victims"]["count"])


def saved_round(attack: dict) -> int:
    """The FL round whose saved model an attack job loads: ``attack.protocol.round``, or 0 with
    ``attack.protocol.mixed`` (the job trains the victim's own rounds from there, CENSOR Fig. 2)."""
    protocol = attack["protocol"]
    return 0 if protocol["mixed"]["batch_size"] else protocol["round"]


def checkpoint_rounds(config: dict) -> list[int]:
    """Every round at which some setting attacks, reconstruction or attribute inference
    (each FL run saves its model there)."""
    rounds = {saved_round(resolve(config, s)["attack"]) for (_, s) in attack_jobs(config)}
    if attribute_jobs(config):
        rounds |= set(config["attribute"]["rounds"])
    return sorted(rounds or {config["attack"]["protocol"]["round"]})


def check_seed(seed: int, seeds: list[int], key: str) -> None:
    """ValueError unless ``seed`` is one of the configured ``seeds`` (at ``key``)."""
    if seed not in seeds:
        raise ValueError(f"--seed {seed} is not one of '{key}' {seeds}; expected one of them "
                         f"(`gradleak plan` lists the jobs)")


def target_spec(config: dict, name: str) -> dict:
    """What a target (or study) reads from the configuration: its entry, the paper's
    numbers beside it and the claims judged on it."""
    return {"target": config["targets"][name], "reference": config["reference"].get(name),
            "claims": claims_on(config, name)}


def claims_on(config: dict, name: str) -> list[dict]:
    """The claims (those ``left_out`` leaves out aside) and regime entries that read target
    ``name``, with each entry's bar (``bar_twin``): what its job measures."""
    entries = claim_rows.entries(config)
    twins = [twin for twin in map(bar_twin, entries) if twin]
    return [claim for claim in [*config["claims"], *entries, *twins]
            if claim["target"] == name and claim["id"] not in config["left_out"]]
