"""The manual's table of every paper target (docs/papers.md): paper, target, command,
output, offline?"""

from __future__ import annotations

from pathlib import Path

from gradleak import config as cfg
from gradleak.experiment import configuration, paths, phases, pipeline, plan

OFFLINE = {"digits", "natural"}  # bundled with scikit-learn and scikit-image


def _offline(config: dict, name: str) -> str:
    """Whether target ``name`` runs on bundled data: the datasets of the jobs it plans alone
    (its cases' as ``plan.points`` selects them, a study's, an evaluation network's photos,
    a DCGAN prior's), and the files no job makes that its jobs read (pretrained priors)."""
    alone = {**config, "targets": {name: config["targets"][name]}}
    results = Path("results")
    jobs = pipeline.walk(alone, results)
    datasets = {job["dataset"] for job in jobs["prepare_data"]}
    files = {path.as_posix() for phase in phases.every() if not phase.gathers
             for job in jobs[phase.name]
             for path in pipeline.job_inputs(phase, alone, results, job, {})
             if not path.is_relative_to(results)}
    needed = sorted(datasets - OFFLINE) + sorted(files)
    return "yes" if not needed else f"no: needs {', '.join(needed)}"


def targets_table(configs: list[Path]) -> str:
    """A markdown table with one row per target of each paper configuration."""
    lines = ["| paper | target | what | command | output | runs offline? |",
             "|---|---|---|---|---|---|"]
    for path in sorted(configs):
        config = configuration.load(path)
        for name in plan.targets(config):
            target = config["targets"][name]
            folder = paths.target_dir(Path("results"), name).as_posix()
            made = {"table": "table" in target, "reference": name in config["reference"],
                    "claims": "table" in target and bool(plan.claims_on(config, name))}
            files = [f"{name}{suffix}" for suffix, key in
                     ((".csv", "table"), ("_vs_paper.csv", "reference"),
                      ("_claims.csv", "claims")) if made[key]]
            files += [f"{name}{panel}.png" for panel, _ in cfg.figure_specs(target)]
            command = f"`snakemake --cores all --configfile {path.as_posix()} {folder}`"
            title = target["title"].replace("|", r"\|")  # |w| is no cell border
            lines.append(f"| {path.stem} | {name} | {title} | {command} | "
                         f"`{folder}/`: {', '.join(files)} | {_offline(config, name)} |")
    return "\n".join(lines) + "\n"
