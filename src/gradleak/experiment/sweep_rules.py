"""What a swept value must be (a target's ``sweep:`` and ``paired:``, a protocol's
overrides): a path that may be swept, valid where it goes, by the schema and by the
attack's or defense's own rules; and an attack's ``prior_dataset`` against ``gan:``."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gradleak import attacks, defenses
from gradleak.config import (
    ConfigError,
    check,
    definition,
    get_path,
    knob,
    registered_name,
    resolve,
    schema,
    set_path,
)
from gradleak.experiment import priors, victims

SWEEPABLE = ("fl.", "attack.", "attacks.", "defenses.")


def check_sweep_value(config: dict, key: str, value: Any, where: str) -> None:
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
            check_prior_dataset(config, resolved, f"{where}[{key}]")
        else:
            defenses.registered(name).check_config(resolved, config, f"{where}[{key}]")
    else:
        section = copy.deepcopy(config[parts[0]])
        set_path(section, ".".join(parts[1:]), value)
        check(section, {k: v for k, v in schema()["properties"][parts[0]].items()
                        if k != "default"}, f"{where}[{key}]")
        if problem := victims.swept_problem(config, parts[0], section):
            raise ConfigError(f"invalid config: '{where}[{key}]': {problem}")


def check_prior_dataset(config: dict, params: Mapping[str, Any], where: str) -> None:
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
