"""Configuration: load, validate against the JSON schema, fill defaults, name things.

The schema (``schemas/config.schema.yaml``, also at ``workflow/schemas/``) has
``additionalProperties: false`` everywhere, so a misspelt key, a wrong type, an
unknown defense or attack, or a negative strength fails with one line that names
the offending key before any work starts.
"""

from __future__ import annotations

import copy
import json
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


def defense_params(config: dict, name: str) -> dict[str, Any]:
    return dict(config["defenses"].get(name, {}).get("params", {}))


def attack_params(config: dict, name: str) -> dict[str, Any]:
    if name not in config["attacks"]:
        raise ConfigError(f"attack {name!r} is not configured; expected one of "
                          f"{sorted(config['attacks'])}")
    return dict(config["attacks"][name])
