rule attack:
    # One job per setting and seed: its attacks against the same defended uploads (one
    # process, one torch start-up, instead of one per attack).
    input:
        code("data", "models", "fl", "defenses", "attacks", "metrics"),
        attack_job_inputs,
        checkpoint=attack_checkpoint,
    output:
        metrics=paths.attack_metrics(RESULTS, "{case}", "{setting}", "{seed}"),
        details=directory(paths.attack_details(RESULTS, "{case}", "{setting}", "{seed}")),
    params:
        spec=attack_params,
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "attack", "{case}", "{setting}", "seed{seed}"),
    benchmark:
        paths.benchmark(RESULTS, "attack", "{case}", "{setting}", "seed{seed}")
    conda:
        "../envs/fedleak.yaml"
    priority: trained_first
    resources:
        **cluster_resources("attack", attack_minutes),
    shell:
        "fedleak attack --config {params.config} --case {wildcards.case}"
        " --setting {wildcards.setting:q} --seed {wildcards.seed} 2>&1 | tee {log}"
