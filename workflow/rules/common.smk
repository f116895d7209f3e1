# Shared by every rule: the configuration (validated once), the plan, the path functions.
import json
import sys
from pathlib import Path

from snakemake.utils import update_config

from fedleak import config as fedleak_config
from fedleak.experiment import paths, plan
from fedleak.experiment.artifacts import Job, attack_inputs, defense_inputs
from fedleak.experiment.phases import outputs
from fedleak.types import Setting
from fedleak.utils.io import write_json

DEFAULT_CONFIG = "config/config.yaml"
RESULTS = Path("results")


def load_config():
    """A --configfile is the whole configuration; without one, the embedded default.
    --config key=value overrides apply on top of either. Validated before any job."""
    given = dict(config)
    if not workflow.overwrite_configfiles:
        given = fedleak_config.read(DEFAULT_CONFIG)
        update_config(given, dict(config))
    try:
        return fedleak_config.validate(given)
    except fedleak_config.ConfigError as error:
        sys.exit(f"fedleak: {error}")


VALIDATED = load_config()
config.clear()
config.update(VALIDATED)
# Every `fedleak` command reads the same validated configuration.
CONFIG_JSON = RESULTS / "config.resolved.json"
if not CONFIG_JSON.is_file() or json.loads(CONFIG_JSON.read_text()) != config:
    write_json(CONFIG_JSON, config)
TARGETS = outputs(config, RESULTS)
ATTACKS = plan.attack_labels(config)
ROUNDS = plan.checkpoint_rounds(config)


def code(*subpackages):
    """The package modules that a job runs (a change to them re-runs the job)."""
    root = Path("src/fedleak")
    files = [root / "cli.py", root / "config.py", root / "types.py",
             root / "schemas" / "config.schema.yaml"]
    for sub in ("utils", "experiment", *subpackages):
        files += sorted((root / sub).glob("*.py"))
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


def attack_params(wildcards):
    """What an attack job reads from the configuration: a change re-runs it."""
    resolved = job(wildcards).resolved
    return {"attack": resolved["attack"], "fl": resolved["fl"],
            "defense": plan.defense_of(resolved, Setting.parse(wildcards.setting)),
            "attacks": {label: plan.attack_of(resolved, label) for label in ATTACKS}}


def giml_checkpoint(wildcards):
    return Job(config, RESULTS, wildcards.case, Setting("none", 0),
               config["attack"]["seeds"][0]).checkpoint


def tables():
    names = ["utility", "privacy", "tradeoff", "censor_table", "evalnet_monotonicity"]
    return [paths.table(RESULTS, n) for n in names + (["ablation"] if config["ablations"] else [])]
