"""The pipeline's configuration: the schema's checks and defaults (``gradleak.config``),
then the rules between values that no schema states, each failing with one line naming the
key, the value and what was expected, before any job: targets, sweeps, protocols, studies,
the datasets' splits against the victims, clients and GIML's observations they must hold,
labels against batches, seeds, the attacked round, ``gan:`` (``experiment.priors``) and each
attack's and defense's own rules (``check_config``; a swept value's: with its cases)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradleak import attacks, defenses
from gradleak.config import (
    ConfigError,
    check,
    definition,
    figure_specs,
    get_path,
    knob,
    read,
    registered_name,
    resolve,
    schema,
    set_path,
    sweep_column,
    validate_schema,
)
from gradleak.data import datasets
from gradleak.experiment import claims, plan, priors, victims

SWEEPABLE = ("fl.", "attack.", "attacks.", "defenses.")
# Where each key of the flat `attack:` section went when it was split by what its keys are
# about (decision 0089): which victims, the protocol observed, the attacker, the outputs.
MOVED = {"victims": "victims.count", "victims_by_attack": "victims.by_attack",
         "split": "victims.split", "stride": "victims.stride", "victim_class": "victims.class",
         "distinct_labels": "victims.distinct_labels", "round": "protocol.round",
         "batch_size": "protocol.batch_size", "mixed": "protocol.mixed",
         "sequence": "protocol.sequence", "seeds": "attacker.seeds",
         "known_labels": "attacker.known_labels", "adaptive": "attacker.adaptive",
         "adaptive_samples": "attacker.adaptive_samples", "metrics": "outputs.metrics",
         "grid_victims": "outputs.grid_victims", "traces": "outputs.traces",
         "snapshots": "outputs.snapshots"}
ROW_KEYS = ("case", "dataset", "model", "defense", "strength", "attack", "series", "seed",
            "adversary", "attribute", "round")  # the last three: attribute results


def split_capacity(config: dict, dataset: str, split: str = "train") -> int | None:
    """An upper bound of the images in ``split`` of a configured dataset (None: unknown)."""
    return datasets.split_capacity(dataset, config["datasets"].get(dataset, {}), split)


def load(path: str | Path) -> dict:
    """The validated configuration in ``path``, defaults filled."""
    return validate(read(path))


def validate(config: dict | None) -> dict:
    """A validated copy of ``config``: the schema's checks and defaults
    (``config.validate_schema``; at ``scale`` smoke or reduced, its
    ``<scale>_overrides`` merged in first), then the rules between its values, each
    attack's and defense's own included."""
    _refuse_moved(config)
    config = validate_schema(config)
    victims_, attacker = config["attack"]["victims"], config["attack"]["attacker"]
    for label, count in victims_["by_attack"].items():
        if label not in config["attacks"]:
            raise ConfigError(f"invalid config: 'attack.victims.by_attack.{label}': not a "
                              f"configured attack (expected one of {sorted(config['attacks'])})")
        if count > victims_["count"]:
            raise ConfigError(f"invalid config: 'attack.victims.by_attack.{label}' {count} is "
                              f"more than 'attack.victims.count' {victims_['count']}")
    wrappable = definition("attacks", "eot")["properties"]["wraps"]["enum"]
    wrapped = sorted(k for k in config["attacks"]
                     if registered_name(config, "attacks", k) in wrappable)
    for i, label in enumerate(attacker["adaptive"]):
        if label not in wrapped:
            raise ConfigError(f"invalid config: 'attack.attacker.adaptive[{i}]': {label!r} is "
                              f"not a "
                              f"configured attack label of {wrappable} (what the adaptive "
                              f"attacker, EOT, wraps); expected one of {wrapped}")
    snapshots = config["attack"]["outputs"]["snapshots"]
    if attacker["adaptive"] and snapshots:
        raise ConfigError(f"invalid config: 'attack.outputs.snapshots' {snapshots}: the "
                          f"adaptive attacker ('attack.attacker.adaptive' "
                          f"{attacker['adaptive']}, EOT) records no snapshots; expected one "
                          f"of them empty")
    for i, label in enumerate(config["attribute"]["defenses"] or []):
        if label not in config["defenses"]:
            raise ConfigError(f"invalid config: 'attribute.defenses[{i}]': {label!r} is not a "
                              f"configured defense label (expected one of "
                              f"{sorted(config['defenses'])})")
    if missing := sorted(set(attacker["seeds"]) - set(config["fl"]["seeds"])):
        raise ConfigError(f"invalid config: 'attack.attacker.seeds' {missing} are not in "
                          f"'fl.seeds' "
                          f"{config['fl']['seeds']} (attacks observe the FL run of their seed)")
    _validate_protocols(config)
    _validate_targets(config)
    claims.validate(config)
    _validate_combinations(config)
    _validate_classes(config)
    priors.check(config)
    return config


def _moved(key: str, where: str) -> None:
    """ConfigError naming the new path of ``attack.<key>`` from before the split."""
    raise ConfigError(f"invalid config: '{where}': 'attack.{key}' is now "
                      f"'attack.{MOVED[key]}' (the attack: section is split into victims, "
                      f"protocol, attacker and outputs)")


def _refuse_moved(config: Any) -> None:
    """One line naming the new path of any key of the old flat ``attack:`` section, in the
    section itself, its smoke override or a target's sweep (an old int ``victims`` too)."""
    if not isinstance(config, Mapping):
        return
    if "smoke" in config:
        raise ConfigError(f"invalid config: 'smoke' {config['smoke']!r} is now 'scale' (full, "
                          f"reduced or smoke): --config scale=smoke")
    smoke = config.get("smoke_overrides")
    for where, section in (("attack", config.get("attack")),
                           ("smoke_overrides.attack",
                            smoke.get("attack") if isinstance(smoke, Mapping) else None)):
        if not isinstance(section, Mapping):
            continue
        for key, value in section.items():
            if key in MOVED and not (key == "victims" and isinstance(value, Mapping)):
                _moved(key, f"{where}.{key}")
    for root, owner in (("targets", config), ("smoke_overrides.targets", smoke)):
        targets = owner.get("targets") if isinstance(owner, Mapping) else None
        for name, target in (targets or {}).items() if isinstance(targets, Mapping) else ():
            selections = target.get("select") if isinstance(target, Mapping) else None
            for i, selection in enumerate(selections if isinstance(selections, list) else []):
                for kind in ("sweep", "paired"):
                    paths = selection.get(kind) if isinstance(selection, Mapping) else None
                    for path in paths if isinstance(paths, Mapping) else ():
                        head, _, rest = str(path).partition(".")
                        key = rest.split(".")[0]
                        if head == "attack" and key in MOVED and not (
                                key == "victims" and "." in rest):
                            _moved(key, f"{root}.{name}.select[{i}].{kind}.{path}")


def _check_sweep_value(config: dict, key: str, value: Any, where: str) -> None:
    """ConfigError unless ``key`` may be swept and ``value`` is valid there (``config``'s
    cases: those of the selection)."""
    parts = key.split(".")
    if not key.startswith(SWEEPABLE) or (parts[0] == "defenses" and parts[2:3] != ["params"]):
        raise ConfigError(f"invalid config: '{where}': {key!r} cannot be swept; expected "
                          f"fl.*, attack.*, attacks.<label>.* or defenses.<label>.params.*")
    try:
        get_path(config, key)
    except KeyError:
        raise ConfigError(f"invalid config: '{where}': {key!r} is not a path of this "
                          f"configuration (set it first, e.g. a stopper before its threshold)"
                          ) from None
    if parts[0] in ("attacks", "defenses"):
        kind, label = parts[0], parts[1]
        entry = copy.deepcopy(config[kind][label])
        params = entry.pop("params") if kind == "defenses" else entry
        params.pop("attack", None)
        set_path(params, ".".join(parts[3:] if kind == "defenses" else parts[2:]), value)
        name = registered_name(config, kind, label)
        if kind == "defenses" and knob(name) is not None:
            params[knob(name)] = definition(kind, name)["properties"][knob(name)]["default"]
        resolved = resolve(kind, name, params, where=f"{where}[{key}]")
        if kind == "attacks":
            attacks.base.registered(name).check_config(resolved, config, f"{where}[{key}]")
            _check_prior_dataset(config, resolved, f"{where}[{key}]")
        else:
            defenses.registered(name).check_config(resolved, config, f"{where}[{key}]")
    else:
        section = copy.deepcopy(config[parts[0]])
        set_path(section, ".".join(parts[1:]), value)
        check(section, {k: v for k, v in schema()["properties"][parts[0]].items()
                        if k != "default"}, f"{where}[{key}]")
        if problem := victims.swept_problem(config, parts[0], section):
            raise ConfigError(f"invalid config: '{where}[{key}]': {problem}")


def _validate_protocols(config: dict) -> None:
    """Each protocol's values valid where they go; no protocols beside targets."""
    if config["protocols"] and config["targets"]:
        raise ConfigError("invalid config: 'protocols' with 'targets': a target sweeps the "
                          "protocol in its selections; expected one of the two")
    for name, overrides in config["protocols"].items():
        for key, value in overrides.items():
            _check_sweep_value(config, key, value, f"protocols.{name}")


def _validate_study(config: dict, name: str, target: dict) -> set[str]:
    """The study's parameters, datasets and metrics checked; the columns of its rows."""
    kind = target["study"]["kind"]
    definition_ = definition("studies", kind)
    target["study"] = resolve("studies", kind, target["study"], f"targets.{name}.study")
    for key in ("dataset", "datasets"):
        value = target["study"].get(key)
        for dataset in [value] if isinstance(value, str) else value or []:
            if dataset not in config["datasets"]:
                raise ConfigError(f"invalid config: 'targets.{name}.study.{key}': {dataset!r} "
                                  f"is not a configured dataset (expected one of "
                                  f"{sorted(config['datasets'])})")
    images = target["study"].get("images")
    named = [target["study"]["dataset"]] if "dataset" in target["study"] else []
    for dataset in [*named, *target["study"].get("datasets", [])]:
        capacity = split_capacity(config, dataset, "test")
        if images is not None and capacity is not None and images > capacity:
            raise ConfigError(f"invalid config: 'targets.{name}.study.images' {images} is more "
                              f"than the test split of {dataset!r} holds (at most {capacity})")
    label, wanted = target["study"].get("defense"), definition_.get("defense")
    labels = sorted(k for k in config["defenses"]
                    if registered_name(config, "defenses", k) == wanted)
    if label is not None and label not in labels:
        raise ConfigError(f"invalid config: 'targets.{name}.study.defense': {label!r} is not a "
                          f"configured {wanted} defense label (expected one of {labels})")
    for i, label in enumerate(target["study"].get("defenses", [])):
        if label not in config["defenses"]:
            raise ConfigError(f"invalid config: 'targets.{name}.study.defenses[{i}]': {label!r} "
                              f"is not a configured defense label (expected one of "
                              f"{sorted(config['defenses'])})")
    metrics = [m.partition(":")[0] for m in target.get("table", {}).get("metrics", [])]
    metrics += [y for _, figure in figure_specs(target) for y in (
        figure.get("y") if isinstance(figure.get("y"), list) else [figure.get("y")]) if y]
    unknown = sorted({m.partition(":")[0] for m in metrics} - set(definition_["metrics"]))
    if unknown:
        raise ConfigError(f"invalid config: 'targets.{name}': {unknown[0]!r} is not a metric of "
                          f"a {kind} study (expected one of {definition_['metrics']})")
    return set(definition_["columns"])


def _validate_targets(config: dict) -> None:
    datasets = set(schema()["properties"]["datasets"]["properties"])
    models = set(schema()["properties"]["cases"]["items"]["properties"]["model"]["enum"])
    for name, target in config["targets"].items():
        columns = set(ROW_KEYS)
        if ("select" in target) == ("study" in target):
            raise ConfigError(f"invalid config: 'targets.{name}': expected either 'select' (the "
                              f"runs it reads) or 'study' (a measurement without runs), "
                              f"{'not both' if 'select' in target else 'found neither'}")
        if "study" in target:
            columns = _validate_study(config, name, target)
        for i, selection in enumerate(target.get("select", [])):
            where = f"targets.{name}.select[{i}]"
            scoped = {**config, "cases": plan.selected_cases(config, selection)}
            for kind, known in (("datasets", datasets), ("models", models),
                                ("defenses", set(config["defenses"])),
                                ("attacks", set(config["attacks"]))):
                unknown = sorted(set(selection.get(kind, [])) - known)
                if unknown:
                    raise ConfigError(f"invalid config: '{where}.{kind}': {unknown[0]!r} is not "
                                      f"configured (expected one of {sorted(known)})")
            for key, values in selection.get("sweep", {}).items():
                for value in values:
                    _check_sweep_value(scoped, key, value, f"{where}.sweep")
                columns |= {key, sweep_column(key)}
            for key, values in selection.get("paired", {}).items():
                strengths = selection.get("strengths", [])
                if len(values) != len(strengths) or key in selection.get("sweep", {}):
                    raise ConfigError(f"invalid config: '{where}.paired.{key}': {len(values)} "
                                      f"value(s) for {len(strengths)} strength(s); expected one "
                                      f"per entry of the selection's 'strengths', and the path "
                                      f"not also under 'sweep'")
                for value in values:
                    _check_sweep_value(scoped, key, value, f"{where}.paired")
                columns |= {key, sweep_column(key)}
        layout = [*target.get("table", {}).get("rows", []),
                  *target.get("table", {}).get("columns", []),
                  *(figure.get(k) for _, figure in figure_specs(target)
                    for k in ("x", "hue", "panels")),
                  *(k for _, figure in figure_specs(target) for k in figure.get("where", {})),
                  *target.get("where", {})]
        unknown = sorted({k for k in layout if k is not None} - columns)
        if unknown:
            raise ConfigError(f"invalid config: 'targets.{name}': {unknown[0]!r} is not a column "
                              f"of its results (expected one of {sorted(columns)})")
        for suffix, figure in figure_specs(target):
            if isinstance(figure.get("y"), list) and "hue" in figure:
                panel = f" ({suffix})" if suffix else ""
                raise ConfigError(f"invalid config: 'targets.{name}.figure'{panel}: several y "
                                  f"metrics ({figure['y']}) draw one curve each; expected no "
                                  f"hue ({figure['hue']!r}) beside them")
    for i, departure in enumerate(config["departures"]):
        if "key" in departure:
            try:
                get_path(config, departure["key"])
            except KeyError:
                raise ConfigError(f"invalid config: 'departures[{i}].key': "
                                  f"{departure['key']!r} is not a path of the configuration "
                                  f"(expected e.g. 'gan.kind')") from None
    for name, reference in config["reference"].items():
        if name not in config["targets"]:
            raise ConfigError(f"invalid config: 'reference.{name}': not a target (expected one "
                              f"of {sorted(config['targets'])})")
        width = len(reference["columns"])
        table = config["targets"][name].get("table", {})
        keys = [c for c in reference["columns"]
                if c in (*table.get("rows", []), *table.get("columns", []))]
        for i, row in enumerate(reference["rows"]):
            if len(row) != width:
                raise ConfigError(f"invalid config: 'reference.{name}.rows[{i}]' has {len(row)} "
                                  f"values, expected {width} (one per column)")
            for column, cell in zip(reference["columns"], row):
                where = (cell.get("to") or cell.get("from") or {}) if isinstance(cell, Mapping) \
                    else {}
                unknown = sorted(set(where) - set(keys))
                if unknown or (where and column in keys):
                    raise ConfigError(
                        f"invalid config: 'reference.{name}.rows[{i}]': {column!r}'s baseline "
                        f"{where} names {unknown[0] if unknown else column!r}; expected a "
                        f"metric's cell whose baseline changes some of the row keys {keys}")


def _validate_combinations(config: dict) -> None:
    """Values each valid alone that cannot work together: ConfigError naming both keys."""
    for name, spec in config["datasets"].items():
        fractions = spec.get("splits") if isinstance(spec, dict) else None
        if fractions and sum(fractions.values()) > 1 + 1e-9:
            raise ConfigError(f"invalid config: 'datasets.{name}.splits': fractions {fractions} "
                              f"sum to {sum(fractions.values()):.6g}; expected at most 1")
        if fractions and not any(v > 0 for v in fractions.values()):
            raise ConfigError(f"invalid config: 'datasets.{name}.splits': every fraction is 0 "
                              f"({fractions}); expected some > 0")
    for key in ("fl.seeds", "attack.attacker.seeds"):
        if len(set(values := get_path(config, key))) != len(values):
            raise ConfigError(f"invalid config: '{key}': {values} repeats a seed; expected "
                              f"distinct seeds")
    for label, entry in config["defenses"].items():
        strengths = [repr(s) for s in entry["strengths"]]
        if len(set(strengths)) != len(strengths):
            raise ConfigError(f"invalid config: 'defenses.{label}.strengths': "
                              f"{entry['strengths']} repeats a strength; expected distinct "
                              f"values")
    seen: dict = {}
    for i, case in enumerate(config["cases"]):
        part = case["partition"]
        key = (case["dataset"], case["model"], part["kind"],
               {"dirichlet": part["alpha"], "client_dirichlet": part["alpha"],
                "attribute": part["attribute"]}.get(part["kind"]),
               part["clients"])
        if key in seen:
            raise ConfigError(f"invalid config: 'cases[{i}]': the same case as "
                              f"'cases[{seen[key]}]' ({case['dataset']}, {case['model']}, "
                              f"{part['kind']}, {part['clients']} clients), whose results "
                              f"folder it would share; expected distinct cases (run cases that "
                              f"differ only in uniform_init or layout in separate results "
                              f"folders)")
        seen[key] = i
        capacity = split_capacity(config, case["dataset"])
        if capacity is not None and part["clients"] > capacity:
            raise ConfigError(f"invalid config: 'cases[{i}].partition.clients': "
                              f"{part['clients']} clients, but the train split of "
                              f"{case['dataset']!r} holds at most {capacity} images; expected "
                              f"at most {capacity}")
        chosen, size = config["attack"]["victims"], config["attack"]["protocol"]["batch_size"]
        count, split, stride = chosen["count"], chosen["split"], chosen["stride"]
        wanted = count * size
        room = split_capacity(config, case["dataset"], split)
        if config["attacks"] and room is not None and not stride and wanted > room:
            raise ConfigError(f"invalid config: 'attack.victims.count' x "
                              f"'attack.protocol.batch_size' = {count} x {size} = {wanted} "
                              f"distinct images, but the {split} split of {case['dataset']!r} "
                              f"holds at most {room}; expected fewer victims or a smaller batch")
        needed = (wanted - 1) * stride + 1  # CENSOR §V-B: every stride-th image
        if config["attacks"] and room is not None and stride and needed > room:
            raise ConfigError(f"invalid config: 'attack.victims.stride' {stride}: {count} "
                              f"victims x batch_size {size}, every {stride}th image, need "
                              f"{needed} images, but the {split} split of {case['dataset']!r} "
                              f"holds at most {room}; expected a smaller stride or fewer victims")
    if problem := (victims.sequence_problem(config["attack"]) or victims.epochs_problem(config)
                   or victims.labels_problem(config, config["attack"])):
        raise ConfigError(f"invalid config: {problem}")
    protocol = config["attack"]["protocol"]
    mixed = protocol["mixed"]["batch_size"]  # CENSOR Fig. 2: the job trains its rounds
    if protocol["round"] > config["fl"]["rounds"] and not mixed:
        raise ConfigError(f"invalid config: 'attack.protocol.round': {protocol['round']} is "
                          f"after the last FL round ('fl.rounds' {config['fl']['rounds']}); "
                          f"expected 0..{config['fl']['rounds']}")
    giml = config["giml"]
    if late := [s for s in giml["checkpoints"] if s > giml["outer_steps"]]:
        raise ConfigError(f"invalid config: 'giml.checkpoints': step {late[0]} is after the last "
                          f"outer step ('giml.outer_steps' {giml['outer_steps']}); expected "
                          f"0..{giml['outer_steps']}")


def _validate_classes(config: dict) -> None:
    """Each configured attack's and defense's own rules (``check_config``) and, for a
    generator attack with ``prior_dataset``, that its prior fits ``gan:``."""
    for label, entry in config["attacks"].items():
        name, params = entry.get("attack", label), {k: v for k, v in entry.items()
                                                     if k != "attack"}
        attacks.base.registered(name).check_config(params, config, f"attacks.{label}")
        _check_prior_dataset(config, params, f"attacks.{label}")
        if "wraps_params" in params:
            _check_prior_dataset(config, params["wraps_params"],
                                 f"attacks.{label}.wraps_params")
    for label, entry in config["defenses"].items():
        defenses.registered(entry.get("defense", label)).check_config(
            entry["params"], config, f"defenses.{label}.params")


def _check_prior_dataset(config: dict, params: Mapping[str, Any], where: str) -> None:
    """ConfigError unless an attack's ``prior_dataset`` (the dataset of its prior, e.g. GIAS
    Fig. 6's wrong prior) fits ``gan:``: a pretrained prior of that dataset, or a DCGAN
    trained here on a dataset with the split 'gan.split', at a DCGAN's resolution."""
    dataset = params.get("prior_dataset")
    if dataset is None or dataset in priors.pretrained_datasets(config):
        return
    size = config["gan"]["resolution"]
    if size not in (32, 64):
        raise ConfigError(f"invalid config: '{where}.prior_dataset': the prior of {dataset!r} "
                          f"is a DCGAN trained here (no pretrained prior of it in gan: or "
                          f"gan.by_dataset), which 'gan.resolution' {size} does not fit; "
                          f"expected 32 or 64, or a pretrained prior of {dataset!r}",
                          key=f"{where}.prior_dataset")
    split = config["gan"]["split"]
    fractions = config["datasets"].get(dataset, {}).get("splits") or {"all": 1}
    if params.get("prior", "trained") == "trained" and split not in fractions:
        raise ConfigError(f"invalid config: '{where}.prior_dataset': the prior of {dataset!r} "
                          f"trains on 'gan.split' {split!r}, which is not a split of "
                          f"'datasets.{dataset}.splits' {sorted(fractions)}; expected a "
                          f"dataset with that split, or a 'gan.split' every prior dataset has",
                          key=f"{where}.prior_dataset")
