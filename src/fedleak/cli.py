"""``fedleak <command>``: one command per pipeline rule, usable without Snakemake.

Every command reads the same validated configuration (``--config``) and runs one phase
of ``fedleak.experiment``; outputs go under ``--results`` (default ``results``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedleak import attacks, defenses
from fedleak import config as cfg
from fedleak.experiment import attribute, catalog, estimate, phases, plan, studies, verify
from fedleak.types import Setting


def _list(args, config: dict | None) -> None:
    print("attacks: " + ", ".join(attacks.available()))
    knobs = (f"{d} ({defenses.knob(d) or '-'})" for d in defenses.available())
    print("defenses: " + ", ".join(knobs))


def _validate(args, config: dict) -> None:
    print(f"{args.config}: OK ({len(plan.settings(config))} settings, "
          f"{len(plan.attack_labels(config))} attacks, {len(config['cases'])} cases)")


def _plan(args, config: dict) -> None:
    for (case, setting), labels in plan.jobs(config).items():
        print(f"{case} {setting.text} {' '.join(labels) or '(FL only)'}")


def _compare(args, config: dict) -> None:
    print(phases.compare(config, args.results), end="")


def _targets(args, config: dict | None) -> None:
    print(catalog.targets_table(args.configs), end="")


def _estimate(args, config: dict) -> None:
    if args.smoke:  # as `snakemake --config smoke=True`: the smoke_overrides merged in
        config = cfg.validate({**cfg.read(args.config), "smoke": True})
    rows = estimate.estimate(config, args.target_names, args.results)
    print((estimate.csv_text if args.format == "csv" else estimate.text)(rows), end="")


COMMANDS = {
    "list": (_list, "registered attacks and defenses, with their strength knobs", []),
    "validate": (_validate, "check a configuration", []),
    "plan": (_plan, "print each planned case, setting and its attacks, one per line", []),
    "compare": (_compare, "print each target's numbers beside the paper's (after a run)", []),
    "targets": (_targets, "print the README's table of the paper configurations' targets",
                ["configs"]),
    "estimate": (_estimate, "estimated jobs, CPU-hours and GPU-hours of each target, from a "
                 "calibration on this machine (cached)", ["target_names", "format", "smoke"]),
    "prepare-data": (lambda a, c: phases.prepare_data(c, a.results, a.dataset),
                     "prepare one dataset's splits", ["dataset"]),
    "train-evalnet": (lambda a, c: phases.train_evalnet(c, a.results, a.dataset),
                      "train Refiner's evaluation network for a dataset", ["dataset"]),
    "train-gan": (lambda a, c: phases.train_gan(c, a.results, a.dataset),
                  "train the DCGAN prior on a dataset (default: gan.dataset)", ["dataset?"]),
    "train-giml": (lambda a, c: phases.train_giml(c, a.results, a.case),
                   "meta-learn GIML's generator for a case", ["case"]),
    "fl-run": (lambda a, c: phases.run_fl(c, a.results, a.case, a.setting, a.seed),
               "federated training of one case under one setting", ["case", "setting", "seed"]),
    "attack": (lambda a, c: phases.run_attacks(c, a.results, a.case, a.setting, a.seed),
               "every configured attack against one setting's uploads",
               ["case", "setting", "seed"]),
    "train-zoo": (lambda a, c: attribute.train_zoo(c, a.results, a.case, a.seed, a.round),
                  "train RecUP-FL's model zoo for a case, seed and round",
                  ["case", "seed", "round"]),
    "fit-adversaries": (lambda a, c: attribute.fit_adversaries(c, a.results, a.case, a.setting,
                                                               a.seed, a.round),
                        "fit the attribute adversaries once under one setting's model at a "
                        "round", ["case", "setting", "seed", "round"]),
    "attribute": (lambda a, c: attribute.run_attribute(c, a.results, a.case, a.setting,
                                                       a.seed),
                  "attribute-inference adversaries against one setting's uploads",
                  ["case", "setting", "seed"]),
    "study": (lambda a, c: studies.run(c, a.results, a.name),
              "one study target's measurement (no FL or attack run)", ["name"]),
    "target": (lambda a, c: phases.write_target(c, a.results, a.name),
               "one paper target's table, comparison with the paper and figure", ["name"]),
    "aggregate": (lambda a, c: phases.aggregate(c, a.results),
                  "the standard tables and figures, and report.md", []),
    "verify": (lambda a, c: verify.verify(a.root),
               "hash every output dvc.lock records again (after `dvc pull`) and name what "
               "differs", ["root"]),
}
NO_CONFIG = ("list", "targets", "verify")


def _setting(text: str) -> Setting:
    try:
        return Setting.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


ARGUMENTS = {
    "dataset": {"help": "a dataset of the configuration, e.g. digits"},
    "case": {"help": "a case name, e.g. digits-lenet-iid-k10 (fedleak validate lists them)"},
    "setting": {"type": _setting, "help": "a setting, e.g. dp_gaussian-0.01 "
                                               "(fedleak plan lists them)"},
    "seed": {"type": int, "help": "an FL/attack seed of the configuration"},
    "round": {"type": int, "help": "an FL round of attribute.rounds"},
    "name": {"help": "a target of the configuration, e.g. table5"},
    "root": {"type": Path, "default": Path("."),
             "help": "the DVC repository (default: the current folder)"},
    "configs": {"type": Path, "nargs": "+", "help": "paper configurations, e.g. "
                                                    "config/paper/*.yaml"},
    "target_names": {"nargs": "*", "metavar": "target",
                     "help": "targets of the configuration (default: all of them)"},
    "format": {"choices": ("text", "csv"), "default": "text",
               "help": "text (default) or csv: target,jobs,cpu_hours,gpu_hours"},
    "smoke": {"action": "store_true",
              "help": "with the configuration's smoke_overrides, as `--config smoke=True`"},
}
POSITIONAL = ("configs", "target_names")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedleak", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (func, summary, needed) in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        if name not in NO_CONFIG:
            p.add_argument("--config", required=True, help="YAML or JSON configuration")
            p.add_argument("--results", type=Path, default=Path("results"),
                           help="results folder (default: results)")
        for arg in needed:
            optional, arg = arg.endswith("?"), arg.removesuffix("?")  # "dataset?": may be left out
            if arg in POSITIONAL:  # fedleak targets config/paper/*.yaml
                p.add_argument(arg, **ARGUMENTS[arg])
            elif arg in ("root", "format", "smoke"):
                p.add_argument(f"--{arg}", **ARGUMENTS[arg])
            else:
                p.add_argument(f"--{arg}", required=not optional, **ARGUMENTS[arg])
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = cfg.load(args.config) if hasattr(args, "config") else None
        args.func(args, config)
    except (OSError, ValueError) as exc:  # bad input, missing or corrupted files, disk full
        print(f"fedleak {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
