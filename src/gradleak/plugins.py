"""Attacks and defenses from other packages, found through Python entry points.

A package registers a class in the entry-point group ``gradleak.defenses`` or
``gradleak.attacks`` (``[project.entry-points."gradleak.defenses"] name = "pkg:Class"``). The
class is built like a built-in one (``Defense`` or ``Attack`` subclass, its parameters as
keyword arguments) and carries two attributes:

- ``schema``: its parameters as the configuration schema writes a built-in's
  (``{"properties": {param: {"type": ..., "default": ...}}}``, every parameter with a
  default; a defense adds ``knob``, the parameter its ``strengths`` sweep, ``stronger``,
  ``"higher"`` or ``"lower"``, and may add ``work``, ``"gradient"`` where its work on an
  upload does not grow with the batch (default ``"batch"``);
- ``cites``: the paper it implements, printed by ``gradleak list``.

The configuration then names it like a built-in one, ``gradleak validate`` checks its
parameters, and every table and the matched-utility ranking hold it. Its code is not in
the jobs' code digests: a changed plugin re-runs nothing by itself.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

GROUPS = {"attacks": "gradleak.attacks", "defenses": "gradleak.defenses"}


class PluginError(ValueError):
    """An installed plugin that cannot be used: the message names it and its package."""


def _checked(kind: str, name: str, where: str, cls) -> dict:
    """The class's parameter schema as a definition; PluginError naming what is wrong."""
    noun = kind[:-1]
    said = f"{noun} plugin {name!r} ({where})"
    rules = getattr(cls, "schema", None)
    if not isinstance(rules, dict) or not isinstance(rules.get("properties"), dict):
        raise PluginError(f"{said}: its class needs `schema = {{'properties': {{...}}}}`, the "
                          f"parameters as the configuration schema writes them; got {rules!r}")
    if not isinstance(getattr(cls, "cites", None), str):
        raise PluginError(f"{said}: its class needs `cites`, the paper it implements, as a "
                          f"string")
    no_default = sorted(p for p, rule in rules["properties"].items() if "default" not in rule)
    if no_default:
        raise PluginError(f"{said}: parameter {no_default[0]!r} has no default; expected "
                          f"every parameter with the paper's default")
    if kind == "defenses":
        knob = rules.get("knob")
        if knob is not None and knob not in rules["properties"]:
            raise PluginError(f"{said}: knob {knob!r} is none of its parameters "
                              f"{sorted(rules['properties'])}")
        if rules.get("stronger", "higher") not in ("higher", "lower"):
            raise PluginError(f"{said}: stronger {rules['stronger']!r}; expected 'higher' or "
                              f"'lower'")
        if rules.get("work", "batch") not in ("gradient", "batch"):
            raise PluginError(f"{said}: work {rules['work']!r}; expected 'gradient' or 'batch'")
    definition = {"type": "object", "additionalProperties": False, "knob": None, **rules}
    if kind == "attacks":
        definition.pop("knob")
    try:
        Draft202012Validator.check_schema(definition)
    except SchemaError as err:
        raise PluginError(f"{said}: its schema is no JSON Schema: {err.message}") from None
    return definition


@cache
def found(kind: str) -> tuple[tuple[str, type, dict], ...]:
    """(name, class, definition) of each installed plugin of ``kind``, by name."""
    plugins = []
    for point in sorted(entry_points(group=GROUPS[kind]), key=lambda p: p.name):
        where = f"{point.dist.name if point.dist else '?'}: {point.value}"
        try:
            cls = point.load()
        except Exception as err:  # a plugin's import error, named with its package
            raise PluginError(f"{kind[:-1]} plugin {point.name!r} ({where}) does not load: "
                              f"{type(err).__name__}: {err}") from None
        plugins.append((point.name, cls, _checked(kind, point.name, where, cls)))
    return tuple(plugins)


def definitions(kind: str, built_in: dict) -> dict:
    """The installed plugins' parameter schemas by name; a name a built-in holds is refused."""
    out = {}
    for name, cls, definition in found(kind):
        if name in built_in:
            raise PluginError(f"{kind[:-1]} plugin {name!r} ({cls.__module__}) takes the name "
                              f"of a built-in {kind[:-1]}; expected a name other than "
                              f"{sorted(built_in)}")
        out[name] = definition
    return out
