"""A configuration's whole pipeline as jobs of the phases, read from their declarations
(``experiment.phase``): the Snakemake rules, ``gradleak estimate`` and ``dvc.yaml`` all
come from here.

:func:`walk` finds every job: the ones each phase's plan asks for (``planned``), then,
file by file, the job whose output each job reads (matched against every phase's output
patterns, as Snakemake matches them), until nothing new is needed; a job that reads an
output of a phase its own does not declare in ``reads`` is an error. A phase that
``gathers`` (the aggregation) reads the outputs of every job of the phases it names.
A job's code is ``experiment.code``'s, ``dvc.yaml`` ``experiment.dvc``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from gradleak.experiment import artifacts, phases
from gradleak.experiment.job import Job
from gradleak.experiment.phase import WILDCARDS, Identity, Output, Phase

Jobs = dict[str, list[Identity]]


def flat(outputs: dict) -> list[Output]:
    """A phase's named outputs as one list."""
    return [o for value in outputs.values() for o in (value if isinstance(value, list)
                                                      else [value])]


def _key(identity: Identity) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in identity.items()))


def resolved(path: Path, identity: Identity) -> Path:
    """``path`` with its ``{wildcard}`` parts filled from ``identity``."""
    return Path(str(path).format(**{k: str(v) for k, v in identity.items()}))


def _regex(path: Path) -> re.Pattern:
    pattern = re.escape(str(path))
    for name, (constraint, _) in WILDCARDS.items():
        pattern = pattern.replace(re.escape(f"{{{name}}}"), f"(?P<{name}>{constraint})")
    return re.compile(pattern)


def _producers(config: dict, results: Path) -> list[tuple[re.Pattern, Phase]]:
    return [(_regex(output.path), phase) for phase in phases.every() if not phase.gathers
            for output in flat(phase.outputs(config, results, None))]


def job_outputs(phase: Phase, config: dict, results: Path, identity: Identity,
                jobs: Jobs | None = None) -> list[Path]:
    """The files (and folders) one job writes."""
    return [resolved(o.path, identity) for o in flat(phase.outputs(config, results, jobs))]


def outputs_of(config: dict, results: Path, names: Iterable[str], jobs: Jobs) -> list[Path]:
    """The outputs of every job of the phases ``names``."""
    return sorted({path for name in names for identity in jobs.get(name, [])
                   for path in job_outputs(phases.load(name), config, results, identity)})


def needed(phase: Phase, config: dict, results: Path, identity: Identity) -> list[str]:
    """The artifacts a job loads."""
    return list(phase.artifacts(config, results, identity))


def job_inputs(phase: Phase, config: dict, results: Path, identity: Identity,
               jobs: Jobs | None = None) -> list[Path]:
    """The files a job reads: its inputs, its artifacts' files and, for a phase that
    gathers, the outputs of every job of the gathered phases (``jobs``: the walk)."""
    files = list(phase.inputs(config, results, identity))
    wanted = needed(phase, config, results, identity)
    if wanted:
        job = Job.of(config, results, identity)
        files += artifacts.files(job, wanted)
    if phase.gathers:
        files += outputs_of(config, results, phase.gathers, jobs or walk(config, results))
    return sorted(set(files))


def walk(config: dict, results: Path) -> Jobs:
    """Phase name -> every job of the configuration, sorted (see the module's docstring)."""
    producers = _producers(config, results)
    found: dict[str, dict[tuple, Identity]] = {name: {} for name in phases.NAMES}
    todo = [(phase, identity) for phase in phases.every() if not phase.gathers
            for identity in phase.planned(config)]
    while todo:
        phase, identity = todo.pop()
        if _key(identity) in found[phase.name]:
            continue
        found[phase.name][_key(identity)] = identity
        for path in job_inputs(phase, config, results, identity, {}):
            for regex, producer in producers:
                match = regex.fullmatch(str(path))
                if match:
                    _check_reads(phase, identity, path, producer)
                    todo.append((producer, _typed(match.groupdict())))
                    break
    jobs = {name: [found[name][k] for k in sorted(found[name])] for name in phases.NAMES}
    for phase in phases.every():
        if phase.gathers:
            jobs[phase.name] = phase.planned(config) or [{}]
    return jobs


def _check_reads(phase: Phase, identity: Identity, path: Path, producer: Phase) -> None:
    """A job may read only outputs of the phases its phase's ``reads`` declares: DVC's
    stages depend on those folders (``experiment.dvc``), for every configuration."""
    if producer.name != phase.name and producer.name not in phase.reads:
        raise ValueError(f"phase {phase.name!r}: job {dict(identity)} reads {path}, an output "
                         f"of phase {producer.name!r}; expected {producer.name!r} in its "
                         f"reads {list(phase.reads)}")


def _typed(values: dict[str, str]) -> Identity:
    return {k: WILDCARDS[k][1](v) for k, v in values.items()}
