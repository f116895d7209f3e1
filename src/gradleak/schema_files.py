"""The schema's files (``schemas/config.schema.yaml`` and the files of its big sections,
which it refers to by ``$ref``) read as one document, and the YAML loader every
configuration file is read with."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

# PyYAML's safe loader in C where PyYAML was built with libyaml (its wheels are): the same
# documents, 10x faster on the schema, which every job reads
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def schema_file(name: str) -> dict:
    return yaml.load(resources.files("gradleak").joinpath(f"schemas/{name}").read_text(),
                     Loader=SAFE_LOADER)


def inlined(node: Any) -> Any:
    """``node`` with each reference to a section's file (``{$ref: "<file>#/<key>"}``) replaced
    by what it refers to, so the schema is read as one document; ``#/...`` references
    within it stay for the validator."""
    if isinstance(node, dict):
        ref = node.get("$ref", "#")
        if len(node) == 1 and not ref.startswith("#"):
            name, _, key = ref.partition("#/")
            return inlined(schema_file(name)[key])
        return {k: inlined(v) for k, v in node.items()}
    if isinstance(node, list):
        return [inlined(v) for v in node]
    return node
