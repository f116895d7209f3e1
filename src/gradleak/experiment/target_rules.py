"""The rules of ``targets:`` that no schema states, with ``protocols:``, ``departures:``
and ``reference:`` which name targets' values: each target reads runs or is a study; its
selections name configured datasets, models, defenses and attacks and sweep valid values;
its table and figures lay out columns its rows have; a study's datasets, defenses and
metrics are its kind's; a departure's key is a path; the papers' numbers are a target's."""

from __future__ import annotations

from collections.abc import Mapping

from gradleak.config import (
    ConfigError,
    definition,
    figure_specs,
    get_path,
    registered_name,
    resolve,
    schema,
    sweep_column,
)
from gradleak.data import datasets as data_sets
from gradleak.experiment import plan
from gradleak.experiment.sweep_rules import check_sweep_value

ROW_KEYS = ("case", "dataset", "model", "defense", "strength", "attack", "series", "seed",
            "adversary", "attribute", "round")  # the last three: attribute results


def validate_protocols(config: dict) -> None:
    """Each protocol's values valid where they go; no protocols beside targets."""
    if config["protocols"] and config["targets"]:
        raise ConfigError("invalid config: 'protocols' with 'targets': a target sweeps the "
                          "protocol in its selections; expected one of the two")
    for name, overrides in config["protocols"].items():
        for key, value in overrides.items():
            check_sweep_value(config, key, value, f"protocols.{name}")


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
        capacity = data_sets.split_capacity(dataset, config["datasets"].get(dataset, {}),
                                                "test")
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


def validate_targets(config: dict) -> None:
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
                    check_sweep_value(scoped, key, value, f"{where}.sweep")
                columns |= {key, sweep_column(key)}
            for key, values in selection.get("paired", {}).items():
                strengths = selection.get("strengths", [])
                if len(values) != len(strengths) or key in selection.get("sweep", {}):
                    raise ConfigError(f"invalid config: '{where}.paired.{key}': {len(values)} "
                                      f"value(s) for {len(strengths)} strength(s); expected one "
                                      f"per entry of the selection's 'strengths', and the path "
                                      f"not also under 'sweep'")
                for value in values:
                    check_sweep_value(scoped, key, value, f"{where}.paired")
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
