"""The pipeline's configuration: the schema's checks and defaults (``gradleak.config``),
then the rules between values that no schema states, each failing with one line naming the
key, the value and what was expected, before any job: targets, sweeps, protocols, studies,
the datasets' splits against the victims, clients and GIML's observations they must hold,
labels against batches, seeds, the attacked round, ``gan:`` (``experiment.priors``) and each
attack's and defense's own rules (``check_config``; a swept value's: with its cases)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradleak import attacks, defenses
from gradleak.config import (
    ConfigError,
    definition,
    get_path,
    read,
    registered_name,
    validate_schema,
)
from gradleak.data import datasets
from gradleak.experiment import claims, fl_runs, priors, sweep_rules, target_rules, victims

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
    target_rules.validate_protocols(config)
    target_rules.validate_targets(config)
    claims.validate(config)
    _validate_combinations(config)
    _validate_classes(config)
    priors.check(config)
    fl_runs.check_checkpoint_rounds(config)
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
        sweep_rules.check_prior_dataset(config, params, f"attacks.{label}")
        if "wraps_params" in params:
            sweep_rules.check_prior_dataset(config, params["wraps_params"],
                                 f"attacks.{label}.wraps_params")
    for label, entry in config["defenses"].items():
        defenses.registered(entry.get("defense", label)).check_config(
            entry["params"], config, f"defenses.{label}.params")
