# gradleak: the whole chain from raw data to tables, figures and report.md.
#   snakemake --cores all                                       (embedded default, offline, CPU)
#   snakemake --cores all --configfile config/paper/<paper>.yaml    (that file is the whole config)
#   snakemake --configfile config/paper/<paper>.yaml --profile workflow/profiles/slurm
# One rule per pipeline phase, made from its declaration in src/gradleak/experiment/phases/
# (workflow/rules/phases.smk); `snakemake all_<phase>` makes every job of one phase.
from snakemake.utils import min_version

min_version("9.0")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


wildcard_constraints:
    **WILDCARD_CONSTRAINTS,


include: "workflow/rules/phases.smk"


# A local run forks its jobs from one process that has imported torch and the package
# (gradleak.warm): no job pays those imports. Under SLURM the jobs start cold on the nodes.
onstart:
    if workflow.executor_plugin.name == "local":
        warm.start(RESULTS, sum(not job.rule.name.startswith("all")
                                for job in workflow.dag.needrun_jobs()))


onsuccess:
    warm.stop()


onerror:
    warm.stop()


rule all:
    default_target: True
    input:
        paths.report(RESULTS),
