# fedleak: the whole chain from raw data to tables, figures and report.md.
#   snakemake --cores all                                       (embedded default, offline, CPU)
#   snakemake --cores all --configfile config/paper/<paper>.yaml    (that file is the whole config)
#   snakemake --configfile config/paper/<paper>.yaml --profile workflow/profiles/slurm
from snakemake.utils import min_version

min_version("9.0")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


wildcard_constraints:
    dataset="[a-z0-9_]+",
    case="[^/]+",
    setting="[a-z][a-z0-9_]*-[^/]+",
    attack="[a-z][a-z0-9_]*",
    seed=r"\d+",
    round=r"\d+",

include: "workflow/rules/data.smk"
include: "workflow/rules/evalnet.smk"
include: "workflow/rules/gan.smk"
include: "workflow/rules/fl.smk"
include: "workflow/rules/attack.smk"
include: "workflow/rules/attribute.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    default_target: True
    input:
        TARGETS["report"],


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


rule all_attribute:
    input:
        TARGETS["attribute"],
