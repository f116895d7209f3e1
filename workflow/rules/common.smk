# Shared by every rule: the configuration (validated once), the checks before any job, the
# whole plan (every job of every phase, pipeline.walk) and the rules' functions.
import json
import shlex
import sys
from pathlib import Path

import yaml
from snakemake.utils import update_config

from gradleak.utils.runlock import RunInProgress, release_stale_lock

DRY_RUN = bool(workflow.output_settings and workflow.output_settings.dryrun)
# A killed run leaves Snakemake's lock behind: remove it when its owner is gone, so that the
# plain command resumes (unfinished jobs re-run: rerun-incomplete in the default profile).
# A live run's lock stops this run here, first, before it loads the package or writes
# anything.
try:
    STALE_LOCK = release_stale_lock(take=not DRY_RUN and "--nolock" not in sys.argv
                                    ) if workflow.is_main_process else None
except RunInProgress as error:
    sys.exit(str(error))
if STALE_LOCK:
    print(STALE_LOCK, file=sys.stderr)

from gradleak import config as gradleak_config
from gradleak import warm
from gradleak.experiment import claims, cluster, code, configuration, paths, phases, pipeline
from gradleak.experiment import priors, resolved
from gradleak.experiment.phase import WILDCARDS
from gradleak.experiment.phase import typed as job_identity
from gradleak.experiment.phases.prepare_data import missing, victim_problems
from gradleak.utils.io import write_json

DEFAULT_CONFIG = "config/config.yaml"
RESULTS = Path("results")


def yaml_values(value):
    """Snakemake reads nested --config values as text ('3', 'true'): read them as YAML."""
    if isinstance(value, dict):
        return {k: yaml_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml_values(v) for v in value]
    try:
        return yaml.safe_load(value) if isinstance(value, str) and value else value
    except yaml.YAMLError:
        return value


def load_config():
    """A --configfile is the whole configuration; without one, the embedded default.
    --config key=value overrides apply on top of either. Validated before any job."""
    given = {}
    try:
        for path in workflow.overwrite_configfiles or [DEFAULT_CONFIG]:
            update_config(given, gradleak_config.read(path))
        update_config(given, yaml_values(dict(workflow.config_settings.config)))
        return configuration.validate(given)
    except (gradleak_config.ConfigError, OSError) as error:
        sys.exit(f"gradleak: {error}")


# The digests read this checkout's files; a package imported from another tree, with other
# files, is what the jobs would run: say so.
FOREIGN_PACKAGE = code.foreign(workflow.basedir) if workflow.is_main_process else None
if FOREIGN_PACKAGE:
    print(f"gradleak: warning: {FOREIGN_PACKAGE}", file=sys.stderr)
VALIDATED = load_config()
config.clear()
config.update(VALIDATED)
# A pretrained prior's weights file (gan.weights) is no job's output: absent (or settings
# its architecture refuses), stop here.
PRIOR_PROBLEM = priors.problem(config)
if PRIOR_PROBLEM:
    sys.exit(f"gradleak: {PRIOR_PROBLEM}")
RESULTS_PROBLEM = paths.results_problem(RESULTS)  # a file where the folder belongs...
if RESULTS_PROBLEM:
    sys.exit(f"gradleak: {RESULTS_PROBLEM}")
# Every `gradleak` command reads the same validated configuration.
CONFIG_JSON = RESULTS / paths.RESOLVED_CONFIG
try:
    CONFIG_CURRENT = json.loads(CONFIG_JSON.read_text()) == config
except (OSError, ValueError):  # absent, or damaged by hand: written anew
    CONFIG_CURRENT = False
if not CONFIG_CURRENT:
    write_json(CONFIG_JSON, config)
resolved.export(CONFIG_JSON)  # the jobs read it without validating it again
JOBS = pipeline.walk(config, RESULTS)
WILDCARD_CONSTRAINTS = {name: constraint for name, (constraint, _) in WILDCARDS.items()}
MISSING = missing(config, RESULTS, [job["dataset"] for job in JOBS["prepare_data"]])
if MISSING and not DRY_RUN:
    sys.exit(f"gradleak: {MISSING[0]}")
for reason in MISSING if DRY_RUN else []:
    print(f"gradleak: warning: {reason}", file=sys.stderr)
# What this scale cannot decide, by construction (experiment.claims), before any job.
for line in claims.untestable_lines(config) if DRY_RUN else []:
    print(f"gradleak: {line}", file=sys.stderr)
# The attack jobs' victims against the prepared splits (CENSOR's stride, a victim class);
# data not prepared yet are checked when `prepare_data` has made them, before any FL run.
VICTIM_PROBLEMS = victim_problems(config, RESULTS)
if VICTIM_PROBLEMS:
    sys.exit(f"gradleak: {VICTIM_PROBLEMS[0]}")


# -- a phase's rule, from its declaration (workflow/rules/phases.smk) -----------------------

def identity(phase, wildcards):
    return job_identity({w: getattr(wildcards, w) for w in phase.wildcards})


def rule_code(phase):
    """A digest of the package modules a job runs (a change to one re-runs the job through
    its params; experiment.code)."""
    return lambda wildcards: code.job_digest(phase, config, RESULTS,
                                             identity(phase, wildcards), workflow.basedir)


def rule_inputs(phase):
    """The files a job reads: its inputs and its artifacts' (experiment.artifacts)."""
    return lambda wildcards: pipeline.job_inputs(phase, config, RESULTS,
                                                 identity(phase, wildcards), JOBS)


def rule_outputs(phase):
    """Name -> path (or list), as directory() or report() where declared."""
    def made(output):
        path = str(output.path)
        path = directory(path) if output.directory else path
        if output.caption:
            return report(path, caption=f"../report/{output.caption}.rst",
                          category=output.category, subcategory=output.subcategory,
                          labels=dict(output.labels) if output.labels else None,
                          patterns=list(output.patterns))
        return path
    return {name: [made(o) for o in value] if isinstance(value, list) else made(value)
            for name, value in phase.outputs(config, RESULTS, JOBS).items()}


def rule_params(phase):
    """What a job reads from the configuration: a change re-runs it."""
    if not phase.wildcards:
        return phase.params(config, RESULTS, {})
    return lambda wildcards: phase.params(config, RESULTS, identity(phase, wildcards))


def rule_threads(phase):
    """The torch threads of a job that runs a model, for Snakemake to count against
    --cores (and SLURM's CPUs per task); one for the others."""
    return config["threads"] if phase.computes else 1


def rule_priority(phase):
    if not phase.wildcards:
        return phase.priority(config, RESULTS, {})
    return lambda wildcards: phase.priority(config, RESULTS, identity(phase, wildcards))


def rule_path(phase, where):
    """Its log or benchmark file: results/<logs|benchmarks>/<rule>/<its wildcards>."""
    return where(RESULTS, phase.name, *phase.path_parts())


def rule_arguments(phase):
    """The job's identity as ``gradleak <command>``'s arguments (a rule defined in a loop
    reads the names in its shell command when the job runs: they come through ``params``)."""
    return lambda wildcards: " ".join(f"--{w} {shlex.quote(str(getattr(wildcards, w)))}"
                                      for w in phase.wildcards)


def cluster_resources(phase):
    """SLURM resources from the environment (gradleak.experiment.cluster), checked here,
    before any job."""
    try:
        return cluster.resources(phase, config, RESULTS)
    except cluster.ClusterError as error:
        sys.exit(f"gradleak: {error}")
