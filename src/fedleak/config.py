"""Configuration: load, validate against the JSON schema, fill defaults, name things.

The schema (``schemas/config.schema.yaml``, also at ``workflow/schemas/``) has
``additionalProperties: false`` everywhere, so a misspelt key, a wrong type, an
unknown defense or attack, or a negative strength fails with one line that names
the offending key before any work starts.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators


class ConfigError(ValueError):
    """A configuration value that does not match the schema."""


def _with_defaults(base):
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(base, {"properties": set_defaults})


DefaultFillingValidator = _with_defaults(Draft202012Validator)


@lru_cache(maxsize=4)
def schema(path: str | None = None) -> dict:
    """The config schema: the packaged copy, or the file at ``path``."""
    if path is None:
        text = resources.files("fedleak").joinpath("schemas/config.schema.yaml").read_text()
    else:
        text = Path(path).read_text()
    return yaml.safe_load(text)


def _key_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _describe(error) -> str:
    where = _key_path(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        key = ".".join(p for p in (where if error.absolute_path else "", extra[0]) if p)
        return f"unknown key '{key}' (expected one of {allowed})"
    return f"'{where}': {error.message}"


def validate(config: dict, schema_file: str | Path | None = None) -> dict:
    """Return a validated copy of ``config`` with schema defaults filled in."""
    config = copy.deepcopy(config or {})
    rules = schema(None if schema_file is None else str(schema_file))
    errors = sorted(DefaultFillingValidator(rules).iter_errors(config),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise ConfigError(f"invalid config: {_describe(errors[0])}")
    for name, ablation in config["ablations"].items():
        strengths = config["defenses"].get(name, {}).get("strengths", [])
        if ablation["strength"] not in strengths:
            raise ConfigError(f"invalid config: 'ablations.{name}.strength' "
                              f"{ablation['strength']} is not in 'defenses.{name}.strengths' "
                              f"{strengths} (the default-parameter row of the ablation)")
    for name, count in config["attack"]["victims_by_attack"].items():
        if name not in config["attacks"]:
            raise ConfigError(f"invalid config: 'attack.victims_by_attack.{name}': not a "
                              f"configured attack (expected one of {sorted(config['attacks'])})")
        if count > config["attack"]["victims"]:
            raise ConfigError(f"invalid config: 'attack.victims_by_attack.{name}' {count} is "
                              f"more than 'attack.victims' {config['attack']['victims']}")
    missing = sorted(set(config["attack"]["seeds"]) - set(config["fl"]["seeds"]))
    if missing:
        raise ConfigError(f"invalid config: 'attack.seeds' {missing} are not in 'fl.seeds' "
                          f"{config['fl']['seeds']} (attacks observe the FL run of their seed)")
    return config


def load(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    text = path.read_text()
    # JSON is parsed as JSON: PyYAML would read numbers such as 1e-05 as strings.
    return validate((json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)) or {})


def fmt_strength(value: float) -> str:
    """The canonical text of a strength in paths and tables (``0.01``, ``1e-05``, ``4``)."""
    return format(float(value), "g")


def case_name(case: dict) -> str:
    part = case["partition"]
    partition = "iid" if part["kind"] == "iid" else f"dirichlet{fmt_strength(part['alpha'])}"
    return f"{case['dataset']}-{case['model']}-{partition}-k{part['clients']}"


def find_case(config: dict, name: str) -> dict:
    for case in config["cases"]:
        if case_name(case) == name:
            return case
    raise ConfigError(f"unknown case {name!r}; expected one of "
                      f"{[case_name(c) for c in config['cases']]}")


def defense_settings(config: dict) -> Iterator[tuple[str, str]]:
    """(defense, strength text) for every configured setting, ``none`` included."""
    defenses = {"none": {"strengths": [0]}, **config["defenses"]}
    for name in sorted(defenses):
        for strength in defenses[name]["strengths"]:
            yield name, fmt_strength(strength)


def ablation_label(defense: str, param: str, value: float) -> str:
    """The defense-setting name of one ablation point, e.g. ``refiner.beta0.5``."""
    return f"{defense}.{param}{fmt_strength(value)}"


def split_label(label: str) -> tuple[str, dict[str, float]]:
    """``refiner.beta0.5`` -> ("refiner", {"beta": 0.5}); a plain name -> (name, {})."""
    name, _, variant = label.partition(".")
    if not variant:
        return name, {}
    match = re.fullmatch(r"([a-z_]+)(\d[0-9.e+-]*)", variant)
    if match is None:
        raise ConfigError(f"bad ablation setting {label!r}; expected '<defense>.<param><value>'")
    return name, {match[1]: float(match[2])}


def ablation_settings(config: dict) -> Iterator[tuple[str, str]]:
    """(ablation label, strength text) for every point of every configured ablation sweep."""
    for name in sorted(config["ablations"]):
        ablation = config["ablations"][name]
        for param in sorted(ablation["sweep"]):
            for value in ablation["sweep"][param]:
                yield ablation_label(name, param, value), fmt_strength(ablation["strength"])


def defense_params(config: dict, label: str) -> dict[str, Any]:
    """The configured params of a defense setting, with an ablation label's override applied."""
    name, override = split_label(label)
    params = dict(config["defenses"].get(name, {}).get("params", {}))
    for key, value in override.items():
        params[key] = int(value) if key == "iterations" else value
    return params


def attack_params(config: dict, name: str) -> dict[str, Any]:
    if name not in config["attacks"]:
        raise ConfigError(f"attack {name!r} is not configured; expected one of "
                          f"{sorted(config['attacks'])}")
    return dict(config["attacks"][name])
