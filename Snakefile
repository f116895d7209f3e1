# fedleak: the whole chain from raw data to tables, figures and report.md.
#   snakemake --cores all                                   (embedded default, offline, CPU)
#   snakemake --configfile config/paper/refiner.yaml --profile workflow/profiles/slurm
import json
import sys
from pathlib import Path

from fedleak import config as fedleak_config
from fedleak import paths
from fedleak.utils.io import write_json


configfile: "config/config.yaml"


# Validate before any job is scheduled: one line naming the bad key, then stop.
try:
    _validated = fedleak_config.validate(
        config, schema_file=workflow.source_path("workflow/schemas/config.schema.yaml")
    )
except fedleak_config.ConfigError as _error:
    sys.exit(f"fedleak: {_error}")
config.clear()
config.update(_validated)

RESULTS = Path("results")
# Every `fedleak` command reads the same validated, merged configuration.
CONFIG_JSON = RESULTS / "config.resolved.json"
if not CONFIG_JSON.is_file() or json.loads(CONFIG_JSON.read_text()) != config:
    write_json(CONFIG_JSON, config)
TARGETS = paths.targets(config, RESULTS)


def code(*subpackages):
    """The package modules a rule runs: a change to them re-runs the rule."""
    root = Path("src/fedleak")
    files = [root / "cli.py", root / "config.py", root / "paths.py"]
    for sub in ("utils", *subpackages):
        files += sorted((root / sub).glob("*.py"))
    return [str(f) for f in files]


wildcard_constraints:
    dataset="[a-z0-9_]+",
    case="[^/]+",
    defense=r"[a-z_]+(\.[a-z_]+\d[0-9.e+-]*)?",
    strength="[^/]+",
    attack="[a-z_]+",
    seed=r"\d+",


include: "workflow/rules/data.smk"
include: "workflow/rules/evalnet.smk"
include: "workflow/rules/gan.smk"
include: "workflow/rules/fl.smk"
include: "workflow/rules/attack.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    default_target: True
    input:
        TARGETS["report"],
        TARGETS["gan"],


rule all_data:
    input:
        TARGETS["data"],


rule all_evalnet:
    input:
        TARGETS["evalnet"],


rule all_gan:
    input:
        TARGETS["gan"],


rule all_fl:
    input:
        TARGETS["fl"],


rule all_attacks:
    input:
        TARGETS["attacks"],
