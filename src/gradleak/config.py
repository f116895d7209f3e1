"""The configuration's schema engine: load a YAML or JSON file, check it against the JSON
schema, fill defaults.

The schema (``schemas/config.schema.yaml`` and the files of its big sections, which it
refers to and :func:`schema` reads in their places; ``workflow/schemas/`` links to the
folder) is the one source of defaults: the pipeline configuration and ``attacks.build`` /
``defenses.build`` fill theirs from it. It has ``additionalProperties: false``
everywhere, so a misspelt key, a wrong type, an unknown defense or attack, or a
negative strength fails with one line naming the key before any work starts. This module
knows no paper, dataset or algorithm; the rules between values of the pipeline's
configuration are ``experiment.configuration``'s, and a rule of one attack or defense is
its class's ``check_config``.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import numbers
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

from gradleak.schema_files import SAFE_LOADER, inlined, schema_file


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




@lru_cache(maxsize=1)
def schema() -> dict:
    """The configuration schema shipped inside the package, with the parameters of the
    attacks and defenses that installed plugins register (``gradleak.plugins``)."""
    from gradleak import plugins

    rules = inlined(schema_file("config.schema.yaml"))
    for kind in plugins.GROUPS:
        rules["definitions"][kind].update(plugins.definitions(kind, rules["definitions"][kind]))
    return rules


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


def work(defense: str) -> str:
    """"gradient" when a defense's work on one upload does not grow with its batch, else
    "batch" (per-sample passes)."""
    return definition("defenses", defense).get("work", "batch")


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


def sweep_column(key: str) -> str:
    """The table column of a swept configuration path: its last component."""
    return key.rsplit(".", 1)[-1]


def figure_specs(target: dict) -> list[tuple[str, dict]]:
    """A target's figures with their file suffix: ``[("", figure)]`` for one figure, the
    paper's panel letters ``a``, ``b``, ... for a list."""
    figure = target.get("figure")
    if figure is None:
        return []
    if isinstance(figure, dict):
        return [("", figure)]
    return [(chr(ord("a") + i), f) for i, f in enumerate(figure)]


SCALED = ("reduced", "smoke")  # the scales with overrides of their own


def merge(base: dict, update: Mapping) -> dict:
    """``update`` merged into ``base`` in place: mappings key by key, anything else replaced."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def replaced(base: Mapping, update: Mapping, path: str = "") -> list[str]:
    """The dotted paths of the leaves :func:`merge` would replace in ``base``; a mapping
    keyed by names with dots in them (``left_out``'s claim ids) is one leaf."""
    out = []
    for key, value in update.items():
        where = f"{path}{key}"
        if (isinstance(value, Mapping) and isinstance(base.get(key), dict)
                and not any("." in str(name) for name in value)):
            out += replaced(base[key], value, f"{where}.")
        else:
            out.append(where)
    return out


def _value_at(config: Mapping, path: str):
    """The value at a dotted path (None where the configuration has none)."""
    try:
        return copy.deepcopy(get_path(config, path))
    except KeyError:
        return None


def validate_schema(config: dict | None) -> dict:
    """A copy of ``config`` checked against the schema with every default filled in (its
    ``<scale>_overrides`` merged in first where ``scale`` is ``smoke`` or ``reduced``), each
    attack and defense label's parameters resolved; the rules between its values are
    ``experiment.configuration``'s."""
    config = copy.deepcopy(config or {})
    overrides = config.get(f"{config.get('scale')}_overrides")
    if config.get("scale") in SCALED and isinstance(overrides, Mapping):
        if not config.get("full_scale"):  # (a resolved configuration has them already)
            full = validate_schema({**config, "scale": "full"})  # its defaults filled
            config["full_scale"] = {path: _value_at(full, path)
                                    for path in replaced(config, overrides)}
        merge(config, overrides)
    config = check(config, schema())
    _check_labels(config)
    _validate_defenses(config)
    _validate_attacks(config)
    return config


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
    return _with_tables(data or {}, path.parent)


def _table_cell(text: str) -> Any:
    """A CSV cell of the papers' numbers: empty is null; a number, true, false or null as
    JSON reads it; a mapping (a bound, a ratio to a baseline) as YAML; else the text."""
    if text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return yaml.load(text, Loader=SAFE_LOADER) if text.startswith("{") else text


def _with_tables(data: dict, folder: Path) -> dict:
    """``data`` with each ``reference.<target>.file`` (a CSV beside the configuration: a
    header of column names, then one line per row) read in place of ``columns`` and
    ``rows``; ConfigError naming the key and the file where it cannot be read."""
    reference = data.get("reference")
    if not isinstance(reference, dict):
        return data
    for name, entry in reference.items():
        if not isinstance(entry, dict) or "file" not in entry:
            continue
        where, table = f"reference.{name}.file", folder / str(entry["file"])
        try:
            with open(table, newline="", encoding="utf-8") as handle:
                columns, *rows = list(csv.reader(handle))
            rows = [[_table_cell(cell.strip()) for cell in row] for row in rows if row]
        except (OSError, ValueError, yaml.YAMLError) as err:
            reason = err.strerror if isinstance(err, OSError) else " ".join(str(err).split())
            raise ConfigError(f"invalid config: '{where}': {table} cannot be read as the "
                              f"paper's numbers ({reason}); expected a CSV with a header of "
                              f"column names, then one line per row", key=where) from None
        entry.pop("file")
        entry.update(columns=[c.strip() for c in columns], rows=rows)
    return data


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
