"""docs/config.md: every configuration key, its type, default and description, made from
the schema (``gradleak config-reference > docs/config.md``; a test fails when it is stale)."""

from __future__ import annotations

import json

from gradleak import config as cfg

HEADER = """# Configuration reference

Every key a configuration can hold, made from the schema
(`src/gradleak/schemas/`) by `gradleak config-reference > docs/config.md`;
do not edit it by hand. A default is what a key takes when the configuration leaves it out;
`<label>` stands for a name the configuration chooses. What the keys are for, with
examples: [Configuration](configuration.md).
"""

BOUNDS = (("minimum", ">= {}"), ("exclusiveMinimum", "> {}"), ("maximum", "<= {}"),
          ("exclusiveMaximum", "< {}"), ("minItems", "at least {} items"))


def _text(value) -> str:
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _kind(node: dict) -> str:
    """The node's type and bounds in a few words; a reference names its definition."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#definition-{name})"
    kinds = node.get("type", "any")
    words = [" or ".join(kinds) if isinstance(kinds, list) else kinds]
    if "enum" in node:
        words.append("one of " + ", ".join(f"`{_text(v)}`" for v in node["enum"]))
    words += [form.format(node[key]) for key, form in BOUNDS if key in node]
    items = node.get("items")
    if isinstance(items, dict) and ("type" in items or "$ref" in items):
        words.append(f"of {_kind(items)}")
    return ", ".join(words)


def _rows(node: dict, path: str):
    """(path, node) for ``node`` and every key below it, depth first."""
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from _rows(child, f"{path}.{key}" if path else key)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("properties"):
        yield from _rows(extra, f"{path}.<label>")
    items = node.get("items")
    if isinstance(items, dict) and items.get("properties"):
        yield from _rows(items, f"{path}[]")


def _table(node: dict, path: str = "") -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, child in _rows(node, path):
        if not key:
            continue
        default = f"`{_cell(_text(child['default']))}`" if "default" in child else ""
        said = "" if key == path else child.get("description", "")  # the section says it
        lines.append(f"| `{key}` | {_cell(_kind(child))} | {default} | {_cell(said)} |")
    return lines


def _section(title: str, node: dict, path: str) -> list[str]:
    lines = [f"## {title}", ""]
    if node.get("description"):
        lines += [" ".join(node["description"].split()), ""]
    table = _table(node, path)
    if len(table) == 2:  # a leaf definition: no keys below it
        default = f", default `{_cell(_text(node['default']))}`" if "default" in node else ""
        return lines + [f"{_cell(_kind(node))}{default}", ""]
    return lines + table + [""]


def config_reference() -> str:
    """The markdown of docs/config.md."""
    schema = cfg.schema()
    lines = [HEADER]
    for key, node in schema["properties"].items():
        lines += _section(f"`{key}`", node, key)
    definitions = schema["definitions"]
    for group in ("attacks", "defenses"):
        lines += [f"## Parameters of the {group}", ""]
        for name, node in definitions[group].items():
            knob = f" (strength: `{node['knob']}`)" if node.get("knob") else ""
            lines += [f"### `{name}`{knob}", ""]
            lines += (_table(node) if node.get("properties") else ["no parameters"]) + [""]
    lines += ["## Shared definitions", ""]
    for name, node in definitions.items():
        if name not in ("attacks", "defenses"):
            lines += _section(f"Definition `{name}`", node, "")
    return "\n".join(lines).rstrip() + "\n"
