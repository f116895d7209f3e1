"""Configuration: load, validate against the JSON schema, fill defaults.

The schema (``schemas/config.schema.yaml``; ``workflow/schemas/`` links to it) is the
one source of defaults: the pipeline configuration and ``attacks.build`` /
``defenses.build`` fill theirs from it. It has ``additionalProperties: false``
everywhere, so a misspelt key, a wrong type, an unknown defense or attack, or a
negative strength fails with one line naming the key before any work starts.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import re
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators


class ConfigError(ValueError):
    """A configuration value that does not match the schema; ``key`` is its key path
    (relative to what was checked) when one value is at fault."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def _with_defaults(base):
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                sub = _dereference(sub)
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    # a Python tuple is an array too (attacks.build("gifd", steps=(200,))); an integer is an
    # int, not 4.0 (which range() and tensor shapes refuse far from the configuration)
    checker = base.TYPE_CHECKER.redefine_many({
        "array": lambda _, instance: isinstance(instance, (list, tuple)),
        "integer": lambda _, instance: isinstance(instance, numbers.Integral)
        and not isinstance(instance, bool)})
    return validators.extend(base, {"properties": set_defaults}, type_checker=checker)


DefaultFillingValidator = _with_defaults(Draft202012Validator)


def _dereference(rules: dict) -> dict:
    """``rules`` itself, or the definition its ``$ref`` ("#/definitions/<name>") points to."""
    while "$ref" in rules:
        rules = schema()["definitions"][rules["$ref"].rsplit("/", 1)[-1]]
    return rules


# PyYAML's safe loader in C where PyYAML was built with libyaml (its wheels are): the same
# documents, 10x faster on the schema, which every job reads
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=1)
def schema() -> dict:
    """The configuration schema shipped inside the package."""
    return yaml.load(resources.files("fedleak").joinpath("schemas/config.schema.yaml")
                     .read_text(), Loader=SAFE_LOADER)


def _key_path(prefix: str, path) -> str:
    out = prefix
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _non_finite(value: Any, where: str) -> str | None:
    """The key path of the first NaN or infinite number inside ``value``, if any."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) \
            and not math.isfinite(value):  # numpy floats too
        return where
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for key, sub in items:
        found = _non_finite(sub, f"{where}{key}" if str(key).startswith("[")
                            else (f"{where}.{key}" if where else str(key)))
        if found:
            return found
    return None


def check(instance: Any, rules: dict, where: str = "", prefix: str = "invalid config") -> Any:
    """Validate ``instance`` (in place, defaults filled) against ``rules``; raise ConfigError
    "<prefix>: ..." naming the key path ``where`` + the offending key, the value and what
    was expected."""
    bad = _non_finite(instance, where)
    if bad:
        raise ConfigError(f"{prefix}: '{bad}': NaN or infinite numbers are not allowed; "
                          f"expected a finite number", key=bad)
    resolver_schema = {**rules, "definitions": schema()["definitions"]}
    errors = sorted(DefaultFillingValidator(resolver_schema).iter_errors(instance),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        error = errors[0]
        key = _key_path(where, error.absolute_path)
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            extra = sorted(set(error.instance) - set(allowed))
            key = _key_path(where, [*error.absolute_path, extra[0]])
            raise ConfigError(f"{prefix}: unknown key '{key}' (expected one of {allowed})",
                              key=key)
        raise ConfigError(f"{prefix}: '{key}': {error.message}", key=key)
    return instance


def definition(kind: str, name: str) -> dict:
    """The schema of the parameters of the attack or defense ``name`` (kind "attacks" or
    "defenses"); ConfigError listing the known names when there is none."""
    known = schema()["definitions"][kind]
    if name not in known:
        raise ConfigError(f"unknown {kind[:-1]} {name!r}; expected one of {sorted(known)}")
    return _dereference(known[name])


def parameters(kind: str, name: str) -> list[str]:
    """The parameter names of an attack or defense, in schema order."""
    return list(definition(kind, name)["properties"])


def knob(defense: str) -> str | None:
    """The parameter that a defense's ``strengths`` sweep (None for ``none``)."""
    return definition("defenses", defense)["knob"]


def stronger(defense: str) -> str:
    """"higher" when a larger knob value protects more, else "lower"."""
    return definition("defenses", defense).get("stronger", "higher")


def resolve(kind: str, name: str, params: Mapping[str, Any], where: str = "",
            prefix: str = "invalid config") -> dict:
    """``params`` of an attack or defense with its schema defaults filled in, validated.

    A ``wraps_params`` mapping (EOT) is resolved against the wrapped attack's definition.
    """
    resolved = check(copy.deepcopy(dict(params)), definition(kind, name), where, prefix)
    if "wraps_params" in resolved:
        resolved["wraps_params"] = resolve(kind, resolved["wraps"], resolved["wraps_params"],
                                           f"{where}.wraps_params" if where else "wraps_params",
                                           prefix)
    return resolved


def registered_name(config: dict, kind: str, label: str) -> str:
    """The registered attack or defense name of a configured label."""
    entries = config[kind]
    if label not in entries:
        raise ConfigError(f"{kind[:-1]} {label!r} is not configured; expected one of "
                          f"{sorted(entries)}")
    return entries[label].get(kind[:-1], label)


def _label_name(kind: str, label: str, entry: dict) -> str:
    """The registered name a configured label runs (itself, or its ``attack:``/``defense:``)."""
    noun, known = kind[:-1], schema()["definitions"][kind]
    name = entry.get(noun, label)
    if name in known:
        return name
    if noun in entry:
        raise ConfigError(f"invalid config: '{kind}.{label}.{noun}': unknown {noun} {name!r} "
                          f"(expected one of {sorted(known)})")
    raise ConfigError(f"invalid config: unknown key '{kind}.{label}' (expected one of "
                      f"{sorted(known)}, or any label with '{noun}: <name>')")


# what a defense or attack label and a target name may be: each names folders, files, table
# rows and Snakemake wildcards, so nothing in one can reach outside results/
LABEL = re.compile(r"[a-z][a-z0-9_]*")
LABELLED = (("defenses", "defense label"), ("attacks", "attack label"), ("targets", "target name"))


def _check_labels(config: dict) -> None:
    for kind, what in LABELLED:
        for label in config[kind]:
            if not isinstance(label, str) or not LABEL.fullmatch(label):
                raise ConfigError(f"invalid config: '{kind}.{label}': {label!r} is not a valid "
                                  f"{what}; expected a lower-case name (a letter, then "
                                  f"letters, digits or _): it names result folders, files and "
                                  f"table rows", key=f"{kind}.{label}")


def _validate_defenses(config: dict) -> None:
    config["defenses"].setdefault("none", {})  # the undefended run: PMM's reference
    for label, entry in config["defenses"].items():
        where = f"defenses.{label}"
        name = _label_name("defenses", label, entry)
        key = knob(name)
        entry.setdefault("params", {})
        entry.setdefault("strengths", [0] if key is None else None)
        if entry["strengths"] is None:
            raise ConfigError(f"invalid config: '{where}': 'strengths' is a required property "
                              f"(values of its knob '{key}')")
        if key is None and any(s != 0 for s in entry["strengths"]):
            raise ConfigError(f"invalid config: '{where}.strengths': {name!r} has no strength "
                              f"knob; expected [0], got {entry['strengths']}")
        if key is not None:
            rules = definition("defenses", name)["properties"][key]
            for i, strength in enumerate(entry["strengths"]):
                check(strength, rules, f"{where}.strengths[{i}]")
            if key in entry["params"]:
                raise ConfigError(f"invalid config: '{where}.params.{key}': the strength knob "
                                  f"is swept by '{where}.strengths', not set in params")
        entry["params"] = resolve("defenses", name, entry["params"], f"{where}.params")
        if key is not None:
            del entry["params"][key]


def _validate_attacks(config: dict) -> None:
    for label, entry in list(config["attacks"].items()):
        name = _label_name("attacks", label, entry)
        params = {k: v for k, v in entry.items() if k != "attack"}
        resolved = resolve("attacks", name, params, f"attacks.{label}")
        config["attacks"][label] = {**({"attack": name} if "attack" in entry else {}), **resolved}


SWEEPABLE = ("fl.", "attack.", "attacks.", "defenses.")
ROW_KEYS = ("case", "dataset", "model", "defense", "strength", "attack", "series", "seed",
            "adversary", "attribute", "round")  # the last three: attribute results


def sweep_column(key: str) -> str:
    """The table column of a swept configuration path: its last component."""
    return key.rsplit(".", 1)[-1]


def _check_sweep_value(config: dict, key: str, value: Any, where: str) -> None:
    """ConfigError unless ``key`` may be swept and ``value`` is valid there."""
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
            _check_generator(config, name, resolved, f"{where}[{key}]")
    else:
        section = copy.deepcopy(config[parts[0]])
        set_path(section, ".".join(parts[1:]), value)
        check(section, {k: v for k, v in schema()["properties"][parts[0]].items()
                        if k != "default"}, f"{where}[{key}]")


def figure_specs(target: dict) -> list[tuple[str, dict]]:
    """A target's figures with their file suffix: ``[("", figure)]`` for one figure, the
    paper's panel letters ``a``, ``b``, ... for a list."""
    figure = target.get("figure")
    if figure is None:
        return []
    if isinstance(figure, dict):
        return [("", figure)]
    return [(chr(ord("a") + i), f) for i, f in enumerate(figure)]


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
            for kind, known in (("datasets", datasets), ("models", models),
                                ("defenses", set(config["defenses"])),
                                ("attacks", set(config["attacks"]))):
                unknown = sorted(set(selection.get(kind, [])) - known)
                if unknown:
                    raise ConfigError(f"invalid config: '{where}.{kind}': {unknown[0]!r} is not "
                                      f"configured (expected one of {sorted(known)})")
            for key, values in selection.get("sweep", {}).items():
                for value in values:
                    _check_sweep_value(config, key, value, f"{where}.sweep")
                columns |= {key, sweep_column(key)}
            for key, values in selection.get("paired", {}).items():
                strengths = selection.get("strengths", [])
                if len(values) != len(strengths) or key in selection.get("sweep", {}):
                    raise ConfigError(f"invalid config: '{where}.paired.{key}': {len(values)} "
                                      f"value(s) for {len(strengths)} strength(s); expected one "
                                      f"per entry of the selection's 'strengths', and the path "
                                      f"not also under 'sweep'")
                for value in values:
                    _check_sweep_value(config, key, value, f"{where}.paired")
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
    for name, reference in config["reference"].items():
        if name not in config["targets"]:
            raise ConfigError(f"invalid config: 'reference.{name}': not a target (expected one "
                              f"of {sorted(config['targets'])})")
        width = len(reference["columns"])
        for i, row in enumerate(reference["rows"]):
            if len(row) != width:
                raise ConfigError(f"invalid config: 'reference.{name}.rows[{i}]' has {len(row)} "
                                  f"values, expected {width} (one per column)")


def _merge(base: dict, update: Mapping) -> dict:
    """``update`` merged into ``base`` in place: mappings key by key, anything else replaced."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def validate(config: dict | None) -> dict:
    """A validated copy of ``config`` with every schema default filled in; with ``smoke``
    set, its ``smoke_overrides`` merged in first."""
    config = copy.deepcopy(config or {})
    if config.get("smoke") is True and isinstance(config.get("smoke_overrides"), Mapping):
        _merge(config, config["smoke_overrides"])
    config = check(config, schema())
    _check_labels(config)
    _validate_defenses(config)
    _validate_attacks(config)
    attack = config["attack"]
    for label, count in attack["victims_by_attack"].items():
        if label not in config["attacks"]:
            raise ConfigError(f"invalid config: 'attack.victims_by_attack.{label}': not a "
                              f"configured attack (expected one of {sorted(config['attacks'])})")
        if count > attack["victims"]:
            raise ConfigError(f"invalid config: 'attack.victims_by_attack.{label}' {count} is "
                              f"more than 'attack.victims' {attack['victims']}")
    wrappable = definition("attacks", "eot")["properties"]["wraps"]["enum"]
    wrapped = sorted(k for k in config["attacks"]
                     if registered_name(config, "attacks", k) in wrappable)
    for i, label in enumerate(attack["adaptive"]):
        if label not in wrapped:
            raise ConfigError(f"invalid config: 'attack.adaptive[{i}]': {label!r} is not a "
                              f"configured attack label of {wrappable} (what the adaptive "
                              f"attacker, EOT, wraps); expected one of {wrapped}")
    if attack["adaptive"] and attack["snapshots"]:
        raise ConfigError(f"invalid config: 'attack.snapshots' {attack['snapshots']}: the "
                          f"adaptive attacker ('attack.adaptive' {attack['adaptive']}, EOT) "
                          f"records no snapshots; expected one of them empty")
    for i, label in enumerate(config["attribute"]["defenses"] or []):
        if label not in config["defenses"]:
            raise ConfigError(f"invalid config: 'attribute.defenses[{i}]': {label!r} is not a "
                              f"configured defense label (expected one of "
                              f"{sorted(config['defenses'])})")
    missing = sorted(set(attack["seeds"]) - set(config["fl"]["seeds"]))
    if missing:
        raise ConfigError(f"invalid config: 'attack.seeds' {missing} are not in 'fl.seeds' "
                          f"{config['fl']['seeds']} (attacks observe the FL run of their seed)")
    _validate_targets(config)
    _validate_combinations(config)
    _validate_gan(config["gan"])
    return config


# Images per dataset (an upper bound where it depends on a folder): what a split can hold.
# Datasets not listed here (attribute datasets) are checked when they are prepared.
DATASET_SIZES = {"digits": 1797, "mnist": {"train": 60000, "test": 10000},
                 "cifar10": {"train": 50000, "test": 10000},
                 "cifar100": {"train": 50000, "test": 10000},
                 "svhn": {"train": 73257, "test": 26032}}
DATASET_CLASSES = {"cifar100": 100, "imagenet": 1000, "tinyimagenet": 200}


IMAGE_DATASETS = ("digits", "natural", "mnist", "cifar10", "cifar100", "svhn", "imagenet",
                  "tinyimagenet", "ffhq")


def _dataset_size(name: str, spec: dict) -> int | None:
    if name not in IMAGE_DATASETS:
        return None
    if spec.get("stand_in"):
        return 1797 if spec["stand_in"] == "digits" else 1000  # datasets.STAND_IN_SIZE
    if name == "natural":
        return spec["count"]
    if "max_images" in spec:
        return spec["max_images"]
    size = DATASET_SIZES.get(name)
    return size.get(spec.get("split", "train")) if isinstance(size, dict) else size


def split_capacity(config: dict, dataset: str, split: str = "train") -> int | None:
    """An upper bound of the images in ``split`` of a configured dataset (None: unknown)."""
    spec = config["datasets"].get(dataset, {})
    size = _dataset_size(dataset, spec)
    fractions = spec.get("splits") or {}
    if size is None or not fractions:
        return size
    others = sum(v for k, v in fractions.items() if k != split)
    share = max(fractions.get(split, 0), 1 - others if split == next(iter(fractions)) else 0)
    # stratified rounding moves at most one image per class and split
    return int(size * share) + DATASET_CLASSES.get(dataset, 10) * len(fractions)


def sequence_problem(attack: Mapping) -> str | None:
    """Why an ``attack:`` section's ``sequence`` (GIAS App. D) cannot run, naming the keys;
    None when it can or is off (``steps`` 0)."""
    sequence = attack["sequence"]
    if not sequence["steps"]:
        return None
    if sequence["subset"] > attack["batch_size"]:
        return (f"'attack.sequence.subset': {sequence['subset']} images per upload, but "
                f"'attack.batch_size' gives a victim {attack['batch_size']} local images; "
                f"expected at most {attack['batch_size']}")
    if not attack["known_labels"]:
        return (f"'attack.sequence.steps': {sequence['steps']} uploads need "
                f"'attack.known_labels': true (GIAS App. D: the attacker matches each upload "
                f"to its images); got false")
    return None


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
    for key in ("fl.seeds", "attack.seeds"):
        values = get_path(config, key)
        if len(set(values)) != len(values):
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
        giml = config["giml"]
        if capacity is not None and giml["observations"] * giml["batch_size"] > capacity and any(
                entry.get("attack", label) == "giml" for label, entry in config["attacks"].items()):
            raise ConfigError(f"invalid config: 'giml.observations' x 'giml.batch_size' = "
                              f"{giml['observations']} x {giml['batch_size']} distinct images, "
                              f"but the train split of {case['dataset']!r} holds at most "
                              f"{capacity}; expected fewer")
        attack = config["attack"]
        wanted = attack["victims"] * attack["batch_size"]
        room = split_capacity(config, case["dataset"], attack["split"])
        if config["attacks"] and room is not None and not attack["stride"] and wanted > room:
            raise ConfigError(f"invalid config: 'attack.victims' x 'attack.batch_size' = "
                              f"{attack['victims']} x {attack['batch_size']} = {wanted} distinct "
                              f"images, but the {attack['split']} split of {case['dataset']!r} "
                              f"holds at most {room}; expected fewer victims or a smaller batch")
        needed = (wanted - 1) * attack["stride"] + 1  # CENSOR §V-B: every stride-th image
        if config["attacks"] and room is not None and attack["stride"] and needed > room:
            raise ConfigError(f"invalid config: 'attack.stride' {attack['stride']}: "
                              f"{attack['victims']} victims x batch_size {attack['batch_size']}, "
                              f"every {attack['stride']}th image, need {needed} images, but the "
                              f"{attack['split']} split of {case['dataset']!r} holds at most "
                              f"{room}; expected a smaller stride or fewer victims")
    if problem := sequence_problem(config["attack"]):
        raise ConfigError(f"invalid config: {problem}")
    mixed = config["attack"]["mixed"]["batch_size"]  # CENSOR Fig. 2: the job trains its rounds
    if config["attack"]["round"] > config["fl"]["rounds"] and not mixed:
        raise ConfigError(f"invalid config: 'attack.round': {config['attack']['round']} is after "
                          f"the last FL round ('fl.rounds' {config['fl']['rounds']}); expected "
                          f"0..{config['fl']['rounds']}")
    zoo = config["attribute"]["zoo_size"]
    for label, entry in config["defenses"].items():
        params = entry.get("params") or {}
        if entry.get("defense", label) == "recupfl" and (params.get("zoo_models") or 0) > zoo:
            raise ConfigError(f"invalid config: 'defenses.{label}.params.zoo_models': "
                              f"{params['zoo_models']} models, but the zoo holds "
                              f"'attribute.zoo_size' {zoo}; expected at most {zoo}")
    gan = config["gan"]
    fractions = config["datasets"].get(gan["dataset"], {}).get("splits") or {"all": 1}
    if gan["split"] not in fractions:
        raise ConfigError(f"invalid config: 'gan.split': {gan['split']!r} is not a split of "
                          f"'datasets.{gan['dataset']}.splits'; expected one of "
                          f"{sorted(fractions)}")
    giml = config["giml"]
    late = [s for s in giml["checkpoints"] if s > giml["outer_steps"]]
    if late:
        raise ConfigError(f"invalid config: 'giml.checkpoints': step {late[0]} is after the last "
                          f"outer step ('giml.outer_steps' {giml['outer_steps']}); expected "
                          f"0..{giml['outer_steps']}")
    for label, entry in config["attacks"].items():
        params = {k: v for k, v in entry.items() if k != "attack"}
        _check_generator(config, entry.get("attack", label), params, f"attacks.{label}")


def _validate_gan(gan: dict) -> None:
    """ConfigError unless the generator prior's settings fit its kind: a DCGAN 32x32 or 64x64
    and trained here (no weights); a pretrained kind's weights file named, its resolution
    and widths ones its architecture has, BigGAN's classes among its classes (the rest of
    the architecture: ``experiment.priors.problem``, before any job)."""
    kind, size = gan["kind"], gan["resolution"]
    if kind == "dcgan":
        if size not in (32, 64):
            raise ConfigError(f"invalid config: 'gan.resolution': {size!r} is not a DCGAN size; "
                              f"expected 32 or 64", key="gan.resolution")
        if gan["weights"] is not None:
            raise ConfigError(f"invalid config: 'gan.weights': the dcgan prior is trained in the "
                              f"pipeline; expected null, or gan.kind stylegan2 or biggan for "
                              f"{gan['weights']!r}", key="gan.weights")
        return
    if gan["weights"] is None:
        raise ConfigError(f"invalid config: 'gan.weights': gan.kind {kind} is pretrained; "
                          f"expected the path of its local weights file", key="gan.weights")
    spec, steps = gan[kind], size.bit_length() - 1
    lowest = 4 if kind == "stylegan2" else 8
    if size < lowest or size != 2 ** steps:
        raise ConfigError(f"invalid config: 'gan.resolution': {size!r} is not a {kind} size; "
                          f"expected a power of 2, at least {lowest}", key="gan.resolution")
    count = steps - 1  # one width per resolution 4, 8, ..., size
    if spec["widths"] is not None and len(spec["widths"]) != count:
        raise ConfigError(f"invalid config: 'gan.{kind}.widths': {len(spec['widths'])} widths; "
                          f"expected {count}, one per resolution 4..{size}",
                          key=f"gan.{kind}.widths")
    if kind == "biggan" and spec["widths"] is None and size not in (128, 256, 512):
        raise ConfigError(f"invalid config: 'gan.biggan.widths': null (the port's) needs "
                          f"'gan.resolution' 128, 256 or 512, got {size}; expected {count} "
                          f"widths", key="gan.biggan.widths")
    classes = [c for c in (spec.get("classes") or []) if c >= spec["num_classes"]]
    if classes:
        raise ConfigError(f"invalid config: 'gan.biggan.classes': class {classes[0]} is not "
                          f"one of the generator's; expected 0..{spec['num_classes'] - 1} "
                          f"('gan.biggan.num_classes')", key="gan.biggan.classes")


def giml_steps(config: dict) -> list[int]:
    """The outer steps whose GIML generator is kept: 'giml.checkpoints' and the final one."""
    return sorted({*config["giml"]["checkpoints"], config["giml"]["outer_steps"]})


def _check_generator(config: dict, name: str, params: Mapping[str, Any], where: str) -> None:
    """ConfigError unless a generator attack's prior fits the configuration: GIML's ``step``
    one that 'giml.checkpoints' keeps (giml only), ``prior_dataset`` a dataset with the
    split 'gan.split' the prior trains on (gias only); an EOT's wrapped attack likewise."""
    if "wraps_params" in params:
        _check_generator(config, params["wraps"], params["wraps_params"], f"{where}.wraps_params")
    step, dataset = params.get("step"), params.get("prior_dataset")
    if step is not None and name != "giml":
        raise ConfigError(f"invalid config: '{where}.step': {step!r} selects a checkpoint of "
                          f"GIML's meta-learned generator; {name} has none: expected null",
                          key=f"{where}.step")
    if step is not None and step not in giml_steps(config):
        raise ConfigError(f"invalid config: '{where}.step': GIML step {step!r} is not kept; "
                          f"expected one of {giml_steps(config)} ('giml.checkpoints' "
                          f"{config['giml']['checkpoints']} and the final step "
                          f"'giml.outer_steps' {config['giml']['outer_steps']}) or null (the "
                          f"final step)", key=f"{where}.step")
    kind = config["gan"]["kind"]
    if kind != "dcgan" and dataset is not None:
        raise ConfigError(f"invalid config: '{where}.prior_dataset': gan.kind {kind} is the "
                          f"pretrained prior of 'gan.weights', of no pipeline dataset; expected "
                          f"null, got {dataset!r}", key=f"{where}.prior_dataset")
    if kind != "dcgan" and name == "rgap" and params.get("prior_layers"):
        raise ConfigError(f"invalid config: '{where}.prior_layers': R-GAP's latent search "
                          f"runs through the pipeline's DCGAN; expected 0 with gan.kind {kind}, "
                          f"got {params['prior_layers']!r}", key=f"{where}.prior_layers")
    if dataset is None:
        return
    if name == "giml":
        raise ConfigError(f"invalid config: '{where}.prior_dataset': giml's generator is "
                          f"meta-learned from the case's gradients, of no dataset; expected "
                          f"null, got {dataset!r}", key=f"{where}.prior_dataset")
    split = config["gan"]["split"]
    fractions = config["datasets"].get(dataset, {}).get("splits") or {"all": 1}
    if params.get("prior", "trained") == "trained" and split not in fractions:
        raise ConfigError(f"invalid config: '{where}.prior_dataset': the prior of {dataset!r} "
                          f"trains on 'gan.split' {split!r}, which is not a split of "
                          f"'datasets.{dataset}.splits' {sorted(fractions)}; expected a "
                          f"dataset with that split, or a 'gan.split' every prior dataset has",
                          key=f"{where}.prior_dataset")


def read(path: str | Path) -> dict:
    """The YAML or JSON mapping in ``path``, unvalidated; ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"invalid config: {path} is not a UTF-8 text file ({err.reason} at "
                          f"byte {err.start}); expected YAML or JSON") from None
    try:
        # JSON is parsed as JSON: PyYAML would read numbers such as 1e-05 as strings.
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=SAFE_LOADER)
    except (ValueError, yaml.YAMLError) as err:
        reason = " ".join(str(err).split())
        raise ConfigError(f"invalid config: {path} is not valid YAML/JSON ({reason})") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"invalid config: {path} must hold a mapping of keys, "
                          f"got {type(data).__name__}")
    return data or {}


def load(path: str | Path) -> dict:
    """The validated configuration in ``path``, defaults filled."""
    return validate(read(path))


def get_path(config: Mapping, dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``; KeyError naming the path when it is absent."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f"configuration path {dotted!r} does not exist")
        node = node[part]
    return node


def set_path(config: dict, dotted: str, value: Any) -> None:
    """Set ``config["a"]["b"] = value`` for ``"a.b"``, creating mappings on the way."""
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = copy.deepcopy(value)
