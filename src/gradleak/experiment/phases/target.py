"""Phase ``target``: one paper table or figure (a ``targets:`` entry) from the runs its
selections name (``experiment.gather``), the paper's numbers beside ours and its figure,
under results/targets/<name>/."""

from __future__ import annotations

import sys
from pathlib import Path

from gradleak import config as cfg
from gradleak.experiment import fl_runs, paths, plan
from gradleak.experiment.phase import Output, Phase


def write_target(config: dict, results: Path, name: str) -> None:
    """One paper target's table, comparison with the paper and figure."""
    if name not in config["targets"]:
        raise ValueError(f"target {name!r} is not configured; expected one of "
                         f"{plan.targets(config)}")
    # by the job alone: they import the report's plotting stack (phases/aggregate.py)
    from gradleak import report
    from gradleak.experiment.gather import target_inputs

    result = report.write_target(name, config["targets"][name],
                                 target_inputs(config, results, name),
                                 config["reference"].get(name), paths.target_dir(results, name),
                                 plan.claims_on(config, name))
    print(f"{name}: {', '.join(str(f) for f in result.files)}", file=sys.stderr)


def target_files(config: dict, results: Path, name: str) -> list[Path]:
    """The metrics files a target reads (its FL runs, the undefended ones, its attack jobs
    and its attribute jobs; a study's folder)."""
    if name in plan.studies(config):
        return [paths.study_dir(results, name)]
    files, planned = set(), set(fl_runs.fl_settings(config))
    attributed = set(plan.attribute_jobs(config))
    for point in (p for p in plan.points(config) if p.target == name):
        for setting in (plan.fl_setting(point.setting), point.setting.reference):
            if (point.case, setting) in planned:
                files |= {paths.fl_metrics(results, point.case, setting, seed)
                          for seed in config["fl"]["seeds"]}
        if (point.case, plan.fl_setting(point.setting)) in attributed:
            files |= {paths.attribute_metrics(results, point.case,
                                              plan.fl_setting(point.setting), seed)
                      for seed in config["fl"]["seeds"]}
        if point.attacks:
            files |= {paths.attack_metrics(results, point.case, point.setting, seed)
                      for seed in config["attack"]["attacker"]["seeds"]}
    return sorted(files)


PHASE = Phase(
    name="target",
    summary="one paper target's table, comparison with the paper and figure",
    wildcards=("name",),
    folders=("targets",),
    reads=("fl_run", "attack", "attribute", "study"),
    outputs=lambda config, results, jobs=None: {"folder": Output(
        paths.target_dir(results, "{name}"), directory=True, caption="target",
        category="Paper targets", subcategory="{name}", patterns=("{file}.png", "{file}.csv"))},
    run=write_target,
    planned=lambda config: [{"name": name} for name in plan.targets(config)],
    inputs=lambda config, results, job: target_files(config, results, job["name"]),
    params=lambda config, results, job: plan.target_spec(config, job["name"]),
    tables=True,
    work=lambda config, results, job: {
        "figure": len(cfg.figure_specs(config["targets"][job["name"]]))},
    startup="startup:figures",
)
