"""gradleak <command>: one pipeline phase's job, or a command that reads a configuration.

One command per pipeline phase (``experiment.phases``: the command a Snakemake rule runs,
usable without Snakemake), and the commands that read a configuration without running a
phase.

Argument parsing only. A phase's command reads the validated configuration
(``--config``; a run's own file as it is, ``experiment.resolved``), imports its phase's
module alone and calls its job with the job's identity; outputs go under ``--results``
(default ``results``). Every other module loads where a command uses it, so that a light
job (a table and a figure) does not import torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gradleak import warm
from gradleak.experiment import phases, resolved
from gradleak.experiment.phase import WILDCARDS
from gradleak.utils.threads import use_threads


def _list(args, config: dict | None) -> None:
    from gradleak import attacks, defenses, plugins

    print("attacks: " + ", ".join(attacks.available()))
    knobs = (f"{d} ({defenses.knob(d) or '-'})" for d in defenses.available())
    print("defenses: " + ", ".join(knobs))
    for kind in plugins.GROUPS:
        for name, cls, _ in plugins.found(kind):
            print(f"plugin {kind[:-1]} {name} ({cls.__module__}): {cls.cites}")


def _validate(args, config: dict) -> None:
    from gradleak import config as cfg
    from gradleak.experiment import claims, configuration, plan

    if args.scale:  # as `snakemake --config scale=reduced`: its overrides merged in
        config = configuration.validate({**cfg.read(args.config), "scale": args.scale})
    print(f"{args.config}: OK ({len(plan.settings(config))} settings, "
          f"{len(plan.attack_labels(config))} attacks, {len(config['cases'])} cases)")
    for line in claims.untestable_lines(config):
        print(line)
    for reason in _missing_data(config, args.results):  # a run stops on it before any job
        print(f"gradleak validate: warning: {reason}", file=sys.stderr)


def _missing_data(config: dict, results: Path) -> list[str]:
    from gradleak.experiment import pipeline
    from gradleak.experiment.phases.prepare_data import missing

    return missing(config, results, [j["dataset"] for j in
                                     pipeline.walk(config, results)["prepare_data"]])


def _plan(args, config: dict) -> None:
    from gradleak.experiment import plan

    for (case, setting), labels in plan.jobs(config).items():
        print(f"{case} {setting.text} {' '.join(labels) or '(FL only)'}")


def _compare(args, config: dict) -> None:
    from gradleak.experiment.compare import compare

    print(compare(config, args.results), end="")


def _targets(args, config: dict | None) -> None:
    from gradleak.experiment.catalog import targets_table

    print(targets_table(args.configs), end="")


def _estimate(args, config: dict) -> None:
    from gradleak import config as cfg
    from gradleak.experiment import configuration, estimate

    if args.scale:  # as `snakemake --config scale=reduced`: its overrides merged in
        config = configuration.validate({**cfg.read(args.config), "scale": args.scale})
    if args.by == "claim":
        from gradleak.experiment import claim_cost

        rows = claim_cost.rows(config, args.results)
        print(estimate.csv_text(rows) if args.format == "csv"
              else claim_cost.text(rows, config["scale"]), end="")
        return
    rows = estimate.estimate(config, args.target_names, args.results)
    print((estimate.csv_text if args.format == "csv" else estimate.text)(rows), end="")


def _verdicts(args, config: dict | None) -> None:
    import pandas as pd

    from gradleak.report.verdicts import CLAIM_COLUMNS, REGIME_COLUMNS
    from gradleak.report.verdicts_doc import Run, verdicts_text

    def read(path, columns, what):
        table = pd.read_csv(path, keep_default_na=False, na_values=[""])
        if columns == REGIME_COLUMNS and list(table.columns) == columns[:-1]:
            table = table.reindex(columns=columns)  # a run before decision 0111: no bar
        if list(table.columns) != columns:
            raise ValueError(f"{path}: columns {list(table.columns)}, expected {columns} "
                             f"({what})")
        return table

    runs = []
    for path in args.claims:
        if not path.is_file():
            raise ValueError(f"{path}: no such file (a run's results/claims.csv)")
        made = path.with_suffix(".run.json")
        made = json.loads(made.read_text()) if made.is_file() else {}
        if made.get("withdrawn"):  # its verdicts no longer stand: the reason, not the table
            runs.append(Run(None, made=made))
            continue
        claims = read(path, CLAIM_COLUMNS, "results/claims.csv of a run")
        beside = path.with_name(f"{path.stem}-regime.csv") if path.name != "claims.csv" \
            else path.with_name("regime.csv")
        regime = read(beside, REGIME_COLUMNS, "results/regime.csv of a run") \
            if beside.is_file() else None
        notes = path.with_suffix(".md").read_text() if path.with_suffix(".md").is_file() \
            else None
        runs.append(Run(claims, regime, notes, made))
    print(verdicts_text(runs), end="")


def _verify(args, config: dict | None) -> None:
    from gradleak.experiment.verify import verify

    verify(args.root)


def _clean(args, config: dict) -> None:
    from gradleak.experiment import kept

    print(kept.clean(config, args.results, args.remove), end="")


def _dvc_yaml(args, config: dict | None) -> None:
    from gradleak.experiment import code
    from gradleak.experiment.dvc import dvc_yaml

    if warning := code.foreign(args.root):
        print(f"gradleak: warning: {warning}", file=sys.stderr)
    print(dvc_yaml(args.root), end="")


def _config_reference(args, config: dict | None) -> None:
    from gradleak.experiment.config_reference import config_reference

    print(config_reference(), end="")


TOOLS = {
    "list": (_list, "registered attacks and defenses, with their strength knobs", []),
    "validate": (_validate, "check a configuration and list the claims its scale cannot "
                 "decide", ["scale"]),
    "plan": (_plan, "print each planned case, setting and its attacks, one per line", []),
    "compare": (_compare, "print each target's numbers beside the paper's (after a run)", []),
    "targets": (_targets, "print the manual's table of the paper configurations' targets "
                "(docs/papers.md)",
                ["configs"]),
    "estimate": (_estimate, "estimated jobs, CPU-hours and GPU-hours of each target (or each "
                 "claim, --by claim), from a calibration on this machine (cached)",
                 ["target_names", "format", "scale", "by"]),
    "verdicts": (_verdicts, "print docs/verdicts.md from runs' claims.csv files (and beside "
                 "each its regime.csv, the notes in a .md and how it was run in a .run.json)",
                 ["claims"]),
    "verify": (_verify, "hash every output dvc.lock records again (after `dvc pull`) and name "
               "what differs", ["root"]),
    "clean": (_clean, "list the kept pieces of killed jobs (results/partial/) that no "
              "planned job of the configuration reads, with their sizes; --remove deletes "
              "them", ["remove"]),
    "dvc-yaml": (_dvc_yaml, "print dvc.yaml, made from the phases' declarations", ["root"]),
    "config-reference": (_config_reference, "print docs/config.md, every configuration key "
                         "made from the schema", []),
}
NO_CONFIG = ("list", "targets", "verdicts", "verify", "dvc-yaml", "config-reference")


def _typed(kind):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return parse


ARGUMENTS = {
    "dataset": {"help": "a dataset of the configuration, e.g. digits"},
    "case": {"help": "a case name, e.g. digits-lenet-iid-k10 (gradleak validate lists them)"},
    "setting": {"help": "a setting, e.g. dp_gaussian-0.01 (gradleak plan lists them)"},
    "seed": {"help": "an FL/attack seed of the configuration"},
    "round": {"help": "an FL round of attribute.rounds"},
    "name": {"help": "a target of the configuration, e.g. table5"},
    "root": {"type": Path, "default": Path("."),
             "help": "the DVC repository (default: the current folder)"},
    "configs": {"type": Path, "nargs": "+", "help": "paper configurations, e.g. "
                                                    "config/paper/*.yaml"},
    "claims": {"type": Path, "nargs": "+", "help": "claims.csv files of runs, e.g. "
                                                   "results/claims.csv"},
    "target_names": {"nargs": "*", "metavar": "target",
                     "help": "targets of the configuration (default: all of them)"},
    "format": {"choices": ("text", "csv"), "default": "text",
               "help": "text (default) or csv: target,jobs,cpu_hours,gpu_hours"},
    "scale": {"choices": ("full", "reduced", "smoke"),
              "help": "at this scale, as `--config scale=reduced` (default: the "
                      "configuration's own)"},
    "remove": {"action": "store_true", "help": "delete what is listed"},
    "by": {"choices": ("target", "claim"), "default": "target",
           "help": "a row per target (default) or per claim: the jobs its rows and regime "
                   "need alone"},
}
POSITIONAL = ("configs", "claims", "target_names")


def _run_phase(phase):
    def run(args, config: dict) -> None:
        identity = {w: getattr(args, w) for w in phase.wildcards}
        pieces = {}
        if phase.resumable:  # what a killed job kept
            from gradleak.experiment import kept

            pieces["resume"] = kept.resume(phase, config, args.results, identity)
        # the threads Snakemake counts for the job, before it loads SciPy or scikit-learn
        use_threads(config["threads"] if phase.computes else 1)
        phase.run(config, args.results, **identity, **pieces)
    return run


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; ``only``: a phase's command, whose module alone is loaded."""
    parser = argparse.ArgumentParser(prog="gradleak", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {name: spec for name, spec in TOOLS.items() if only is None}
    for phase in phases.every() if only is None else [phases.by_command(only)]:
        commands[phase.command] = (_run_phase(phase), phase.summary, list(phase.wildcards))
    for name, (func, summary, needed) in commands.items():
        p = sub.add_parser(name, help=summary, description=summary)
        if name not in NO_CONFIG:
            p.add_argument("--config", required=True, help="YAML or JSON configuration")
            p.add_argument("--results", type=Path, default=Path("results"),
                           help="results folder (default: results)")
        for arg in needed:
            if arg in POSITIONAL:  # gradleak targets config/paper/*.yaml
                p.add_argument(arg, **ARGUMENTS[arg])
            elif arg in WILDCARDS:
                p.add_argument(f"--{arg}", required=True, type=_typed(WILDCARDS[arg][1]),
                               **ARGUMENTS[arg])
            else:
                p.add_argument(f"--{arg}", **ARGUMENTS[arg])
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0].replace("-", "_") if argv else ""
    if argv[:1] == [warm.SERVE]:  # a local Snakemake run's warm server (gradleak.warm)
        warm.serve(argv[1], int(argv[2]), main)
        return 0
    if name in phases.NAMES and (code := warm.handoff(argv)) is not None:
        return code
    args = _parser(argv[0] if name in phases.NAMES else None).parse_args(argv)
    try:
        config = resolved.load(args.config) if hasattr(args, "config") else None
        args.func(args, config)
    except (OSError, ValueError) as exc:  # bad input, missing or corrupted files, disk full
        print(f"gradleak {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
