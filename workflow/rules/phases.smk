# One rule per pipeline phase, each made from the phase's declaration
# (src/gradleak/experiment/phases/<phase>.py): its outputs, the files its jobs read, the
# configuration values and a digest of the code they read, its log, priority and cluster
# resources; and all_<phase>, every job of the phase that the configuration plans (DVC's
# stages run them).
for phase in phases.every():

    rule:
        name:
            phase.name
        input:
            files=rule_inputs(phase),
        output:
            **rule_outputs(phase),
        params:
            spec=rule_params(phase),
            code=rule_code(phase),
            config=CONFIG_JSON,
            command=phase.command,
            identity=rule_arguments(phase),
        log:
            rule_path(phase, paths.log),
        benchmark:
            rule_path(phase, paths.benchmark)
        threads: rule_threads(phase)
        priority: rule_priority(phase)
        resources:
            **cluster_resources(phase),
        conda:
            "../envs/gradleak.yaml"
        shell:
            "gradleak {params.command} --config {params.config} {params.identity} 2>&1"
            " | tee {log}"

    rule:
        name:
            f"all_{phase.name}"
        input:
            pipeline.outputs_of(config, RESULTS, [phase.name], JOBS),
