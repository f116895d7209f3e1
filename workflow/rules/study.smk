rule study:
    # A paper's measurement without FL or attack runs (a target with `study:`).
    input:
        code("data", "models", "defenses", "attacks", "metrics", "fl", "adversaries"),
        study_inputs,
    output:
        directory(paths.study_dir(RESULTS, "{name}")),
    params:
        spec=target_params,
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "study", "{name}"),
    benchmark:
        paths.benchmark(RESULTS, "study", "{name}")
    resources:
        **cluster_resources("study"),
    conda:
        "../envs/fedleak.yaml"
    shell:
        "fedleak study --config {params.config} --name {wildcards.name} 2>&1 | tee {log}"
