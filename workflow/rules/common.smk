# Shared by every rule: the configuration (validated once), the plan, the path functions.
import json
import sys
from pathlib import Path

import yaml
from snakemake.utils import update_config

from fedleak import config as fedleak_config
from fedleak.experiment import cluster, paths, plan, priors, studies, victims
from fedleak.experiment.artifacts import Job, attack_inputs, defense_inputs
from fedleak.experiment.phases import missing_datasets, outputs, target_files
from fedleak.types import Setting
from fedleak.utils.io import write_json
from fedleak.utils.runlock import RunInProgress, release_stale_lock

DEFAULT_CONFIG = "config/config.yaml"
RESULTS = Path("results")


def typed(value):
    """Snakemake reads nested --config values as text ('3', 'true'): read them as YAML."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
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
            update_config(given, fedleak_config.read(path))
        update_config(given, typed(dict(workflow.config_settings.config)))
        return fedleak_config.validate(given)
    except (fedleak_config.ConfigError, OSError) as error:
        sys.exit(f"fedleak: {error}")


VALIDATED = load_config()
config.clear()
config.update(VALIDATED)
DRY_RUN = bool(workflow.output_settings and workflow.output_settings.dryrun)
# A pretrained prior's weights file (gan.weights) is no job's output: absent (or settings
# its architecture refuses), stop here.
PRIOR_PROBLEM = priors.problem(config)
if PRIOR_PROBLEM:
    sys.exit(f"fedleak: {PRIOR_PROBLEM}")
RESULTS_PROBLEM = paths.results_problem(RESULTS)  # a file where the folder belongs...
if RESULTS_PROBLEM:
    sys.exit(f"fedleak: {RESULTS_PROBLEM}")
# A killed run leaves Snakemake's lock behind: remove it when its owner is gone, so that the
# plain command resumes (unfinished jobs re-run: rerun-incomplete in the default profile).
# A live run's lock stops this run here, before it writes anything.
try:
    STALE_LOCK = release_stale_lock(take=not DRY_RUN and "--nolock" not in sys.argv
                                    ) if workflow.is_main_process else None
except RunInProgress as error:
    sys.exit(str(error))
if STALE_LOCK:
    print(STALE_LOCK, file=sys.stderr)
# Every `fedleak` command reads the same validated configuration.
CONFIG_JSON = RESULTS / paths.RESOLVED_CONFIG
try:
    CONFIG_CURRENT = json.loads(CONFIG_JSON.read_text()) == config
except (OSError, ValueError):  # absent, or damaged by hand: written anew
    CONFIG_CURRENT = False
if not CONFIG_CURRENT:
    write_json(CONFIG_JSON, config)
TARGETS = outputs(config, RESULTS)
ROUNDS = plan.checkpoint_rounds(config)
MISSING = missing_datasets(config, RESULTS)
if MISSING and not DRY_RUN:
    sys.exit(f"fedleak: {MISSING[0]}")
for reason in MISSING if DRY_RUN else []:
    print(f"fedleak: warning: {reason}", file=sys.stderr)
# The attack jobs' victims against the prepared splits (CENSOR's stride, a victim class);
# data not prepared yet are checked when `prepare_data` has made them, before any FL run.
VICTIM_PROBLEMS = victims.problems(config, RESULTS)
if VICTIM_PROBLEMS:
    sys.exit(f"fedleak: {VICTIM_PROBLEMS[0]}")


def code(*subpackages):
    """The package modules that a job runs (a change to them re-runs the job)."""
    root = Path("src/fedleak")
    files = [root / "cli.py", root / "config.py", root / "types.py",
             root / "schemas" / "config.schema.yaml"]
    for sub in ("utils", "experiment", *subpackages):
        files += sorted((root / sub).rglob("*.py"))
    return [str(f) for f in files]


def job(wildcards):
    return Job(config, RESULTS, wildcards.case, Setting.parse(wildcards.setting),
               int(wildcards.seed))


def case_data(wildcards):
    return paths.data_manifest(RESULTS, plan.find_case(config, wildcards.case)["dataset"])


def fl_inputs(wildcards):
    return [case_data(wildcards), *defense_inputs(job(wildcards))]


def fl_params(wildcards):
    """What an FL run reads from the configuration: a change re-runs it."""
    resolved = job(wildcards).resolved
    return {"fl": resolved["fl"], "case": plan.find_case(config, wildcards.case),
            "defense": plan.defense_of(resolved, Setting.parse(wildcards.setting)),
            "rounds": ROUNDS}


def attack_checkpoint(wildcards):
    return job(wildcards).checkpoint


def attack_job_inputs(wildcards):
    return [case_data(wildcards), *attack_inputs(job(wildcards))]


def trained_first(wildcards):
    """Snakemake's priority among ready jobs: a setting whose defense loads a trained
    artifact (RecUP-FL's zoo, Refiner's evaluation network) makes its rule's longest jobs,
    so they start first (longest first: no long job left alone at the end)."""
    return int(bool(defense_inputs(job(wildcards))))


def cluster_resources(rule, minutes=cluster.FIXED_MINUTES):
    """SLURM resources from the environment (fedleak.experiment.cluster), checked here,
    before any job."""
    try:
        return cluster.resources(rule, minutes, config=config)
    except cluster.ClusterError as error:
        sys.exit(f"fedleak: {error}")


def attack_minutes(wildcards):
    this = job(wildcards)
    return cluster.attack_minutes(this.resolved, this.attacks)


def fl_minutes(wildcards):
    return cluster.fl_minutes(job(wildcards).resolved,
                              plan.find_case(config, wildcards.case)["partition"]["clients"])


def attack_params(wildcards):
    """What an attack job reads from the configuration: a change re-runs it."""
    this = job(wildcards)
    resolved = this.resolved
    return {"attack": resolved["attack"], "fl": resolved["fl"],
            "defense": plan.defense_of(resolved, this.setting),
            "attacks": {label: plan.attack_of(resolved, label) for label in this.attacks},
            # a pretrained prior's architecture, space and classes (a DCGAN's are its file's)
            **({"gan": resolved["gan"]} if priors.pretrained(resolved) else {})}


def giml_checkpoint(wildcards):
    return Job(config, RESULTS, wildcards.case, Setting("none", 0),
               config["attack"]["seeds"][0]).checkpoint


def zoo_checkpoint(wildcards):
    return paths.checkpoint(RESULTS, wildcards.case, plan.NONE, wildcards.seed, wildcards.round)


def attribute_fl_metrics(wildcards):
    """The setting's FL run: its checkpoints at attribute.rounds and its learning loss."""
    fl = paths.fl_dir(RESULTS, wildcards.case, wildcards.setting, wildcards.seed)
    return [fl / "metrics.json"] + [fl / f"round{r}.pt" for r in config["attribute"]["rounds"]]


def attribute_rounds(wildcards):
    return plan.resolve(config, Setting.parse(wildcards.setting))["attribute"]["rounds"]


def attribute_adversaries(wildcards):
    """The fitted adversaries the setting's attribute job uses at each of its rounds."""
    setting = Setting.parse(wildcards.setting)
    return [paths.adversaries_file(RESULTS, wildcards.case, plan.adversary_setting(setting, r),
                                   wildcards.seed, r) for r in attribute_rounds(wildcards)]


def adversary_checkpoint(wildcards):
    return paths.checkpoint(RESULTS, wildcards.case, wildcards.setting, wildcards.seed,
                            wildcards.round)


def clean_attribute_spec(spec):
    """``attribute.*`` less ``adaptive``: the model zoo and the paper's adversaries learn
    from clean gradients whatever it is (toggling it re-runs only the attribute jobs)."""
    return {k: v for k, v in spec.items() if k != "adaptive"}


def adversary_params(wildcards):
    """What fitting the adversaries reads from the configuration: a change re-runs it."""
    resolved = plan.resolve(config, Setting.parse(wildcards.setting))
    return {"attribute": clean_attribute_spec(resolved["attribute"]),
            "case": plan.find_case(config, wildcards.case)}


def attribute_params(wildcards):
    """What an attribute job reads from the configuration: a change re-runs it."""
    resolved = job(wildcards).resolved
    return {"attribute": resolved["attribute"], "fl": resolved["fl"],
            "defense": plan.defense_of(resolved, Setting.parse(wildcards.setting))}


def aggregate_params():
    """What the aggregate reads from the configuration: a change re-runs it."""
    return {k: config[k] for k in ("title", "attack")}


def caption(figure):
    """The caption file of a standard figure: pmm_vs_psnr, tradeoff, censor, recon, evalnet,
    attribute or matched_utility."""
    return next(kind for kind in ("pmm_vs_psnr", "tradeoff", "censor", "recon", "evalnet",
                                  "attribute", "matched_utility")
                if figure.stem.startswith(kind))


def target_inputs(wildcards):
    return target_files(config, RESULTS, wildcards.name)


def study_inputs(wildcards):
    return studies.inputs(config, RESULTS, wildcards.name)


def target_params(wildcards):
    """What a target reads from the configuration: a change re-runs it."""
    return {"target": config["targets"][wildcards.name],
            "reference": config["reference"].get(wildcards.name)}
