rule fl_run:
    input:
        code("data", "models", "fl", "defenses", "metrics"),
        fl_inputs,
    output:
        metrics=paths.fl_metrics(RESULTS, "{case}", "{setting}", "{seed}"),
        final=paths.fl_dir(RESULTS, "{case}", "{setting}", "{seed}") / "final.pt",
        checkpoints=[paths.checkpoint(RESULTS, "{case}", "{setting}", "{seed}", r)
                     for r in ROUNDS],
    params:
        spec=fl_params,
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "fl_run", "{case}", "{setting}", "seed{seed}"),
    benchmark:
        paths.benchmark(RESULTS, "fl_run", "{case}", "{setting}", "seed{seed}")
    conda:
        "../envs/fedleak.yaml"
    priority: trained_first
    resources:
        **cluster_resources("fl_run", fl_minutes),
    shell:
        "fedleak fl-run --config {params.config} --case {wildcards.case}"
        " --setting {wildcards.setting:q} --seed {wildcards.seed} 2>&1 | tee {log}"
