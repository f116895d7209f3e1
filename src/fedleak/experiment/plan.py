"""What a validated configuration asks for: its cases, its settings (one per defense
strength and per ablation point), its attack labels, and each setting's resolved
configuration."""

from __future__ import annotations

import copy
from typing import Any

from fedleak import config as cfg
from fedleak.types import Setting, frozen, number_text

ATTACK_KEYS = ("attack.", "attacks.")  # overrides that leave the FL run unchanged


def case_name(case: dict) -> str:
    """``dataset-model-partition-kK``, e.g. ``digits-lenet-iid-k10``."""
    part = case["partition"]
    partition = "iid" if part["kind"] == "iid" else f"dirichlet{number_text(part['alpha'])}"
    return f"{case['dataset']}-{case['model']}-{partition}-k{part['clients']}"


def case_names(config: dict) -> list[str]:
    return [case_name(c) for c in config["cases"]]


def find_case(config: dict, name: str) -> dict:
    for case in config["cases"]:
        if case_name(case) == name:
            return case
    raise cfg.ConfigError(f"unknown case {name!r}; expected one of {case_names(config)}")


def _base_value(config: dict, setting: Setting, key: str) -> Any:
    if "." in key:
        return cfg.get_path(config, key)
    return config["defenses"][setting.defense]["params"][key]


def normalize(config: dict, setting: Setting) -> Setting:
    """``setting`` without the overrides that repeat the configured value."""
    kept = {k: v for k, v in setting.overrides if frozen(_base_value(config, setting, k)) != v}
    return Setting.of(setting.defense, setting.strength, kept)


def settings(config: dict) -> list[Setting]:
    """Every setting: each strength of each defense label, then each ablation point."""
    points = [Setting.of(label, strength)
              for label in sorted(config["defenses"])
              for strength in config["defenses"][label]["strengths"]]
    for label in sorted(config["ablations"]):
        ablation = config["ablations"][label]
        for param in sorted(ablation["sweep"]):
            points += [normalize(config, Setting.of(label, ablation["strength"], {param: value}))
                       for value in ablation["sweep"][param]]
    return list(dict.fromkeys(points))


def ablation_points(config: dict) -> list[dict]:
    """Each value of each ablation sweep (and the configured default value), with the label
    of the setting that runs it, sorted as the ablation table lists them."""
    points = []
    for label in sorted(config["ablations"]):
        ablation = config["ablations"][label]
        for param in sorted(ablation["sweep"]):
            default = config["defenses"][label]["params"][param]
            for value in sorted({*ablation["sweep"][param], default}):
                setting = normalize(config, Setting.of(label, ablation["strength"], {param: value}))
                points.append({"defense": label, "param": param, "value": value,
                               "default": value == default,
                               "strength": float(ablation["strength"]), "label": setting.label})
    return points


def fl_setting(setting: Setting) -> Setting:
    """The part of ``setting`` that the FL run depends on."""
    return setting.without(ATTACK_KEYS)


def fl_settings(config: dict) -> list[Setting]:
    return list(dict.fromkeys(fl_setting(s) for s in settings(config)))


def check_setting(config: dict, setting: Setting) -> None:
    """ConfigError unless ``setting`` is one of the configuration's settings."""
    known = {s: None for s in settings(config)}
    known.update({fl_setting(s): None for s in known})
    if setting not in known:
        raise cfg.ConfigError(f"setting {setting.text!r} is not planned by this configuration; "
                              f"expected one of {[s.text for s in known]}")


def resolve(config: dict, setting: Setting) -> dict:
    """The configuration of one setting: ``config`` with its overrides applied."""
    resolved = copy.deepcopy(config)
    for key, value in setting.defense_params.items():
        resolved["defenses"][setting.defense]["params"][key] = value
    for key, value in setting.config_overrides.items():
        cfg.set_path(resolved, key, value)
    return resolved


def defense_of(config: dict, setting: Setting) -> tuple[str, dict]:
    """The registered defense name and its parameters (strength knob included)."""
    name = cfg.registered_name(config, "defenses", setting.defense)
    params = dict(resolve(config, setting)["defenses"][setting.defense]["params"])
    knob = cfg.knob(name)
    if knob is not None:
        params[knob] = setting.strength
    return name, params


def attack_labels(config: dict) -> list[str]:
    return sorted(config["attacks"])


def attack_of(config: dict, label: str) -> tuple[str, dict]:
    """The registered attack name of ``label`` and its parameters."""
    params = dict(config["attacks"][label])
    return params.pop("attack", label), params


def victims(config: dict, label: str) -> int:
    """How many of a setting's victims the attack ``label`` reconstructs."""
    return config["attack"]["victims_by_attack"].get(label, config["attack"]["victims"])


def checkpoint_rounds(config: dict) -> list[int]:
    """Every round at which some setting attacks (each FL run saves its model there)."""
    return sorted({resolve(config, s)["attack"]["round"] for s in settings(config)})
