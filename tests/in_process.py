"""A configuration's whole plan run in this process: every job of ``pipeline.walk`` through
the function its ``gradleak <command>`` calls (``Phase.run``), each once the jobs that make
its inputs have run, with the configuration the rules hand their jobs (validated, written
as ``results/config.resolved.json`` and read back). Each job must make every output
its phase declares, as Snakemake requires. What it leaves out is Snakemake and a
Python start-up per job, which in a paper's smoke run is most of a job's time (importing
torch alone takes 3-4 s; docs/measurements.md, m56)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from gradleak import config as cfg
from gradleak.experiment import configuration, paths, phases, pipeline
from gradleak.utils.io import write_json


def resolved(config_file: Path, results: Path, **overrides) -> dict:
    """The configuration as the Snakefile resolves ``--configfile config_file --config
    overrides``, written where the rules write it, as every job reads it."""
    config = configuration.validate({**cfg.read(config_file), **overrides})
    write_json(results / paths.RESOLVED_CONFIG, config)
    return configuration.load(results / paths.RESOLVED_CONFIG)


def run_plan(config: dict, results: Path) -> Counter:
    """Run every job of ``config``'s plan; returns the jobs run per phase."""
    jobs = pipeline.walk(config, results)
    pending = [(phase, identity) for phase in phases.every() for identity in jobs[phase.name]]
    made = [{str(p) for p in pipeline.job_outputs(phase, config, results, identity, jobs)}
            for phase, identity in pending]
    ran: Counter = Counter()
    while pending:
        later = set().union(*made)
        ready = next((k for k, (phase, identity) in enumerate(pending)
                      if not {str(p) for p in pipeline.job_inputs(phase, config, results,
                                                                   identity, jobs)}
                      & (later - made[k])), None)
        assert ready is not None, f"no job whose inputs are made: {pending}"
        phase, identity = pending.pop(ready)
        outputs = made.pop(ready)
        phase.run(config, results, **identity)
        missing = sorted(p for p in outputs if not Path(p).exists())
        assert not missing, f"{phase.name} {identity} did not make {missing}"
        ran[phase.name] += 1
    return ran
