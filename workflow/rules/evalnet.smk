rule train_evalnet:
    input:
        code("data", "models"),
        public=paths.data_manifest(RESULTS, config["evalnet"]["dataset"]),
        target=paths.data_manifest(RESULTS, "{dataset}"),
    output:
        model=paths.evalnet_file(RESULTS, "{dataset}"),
        meta=paths.evalnet_file(RESULTS, "{dataset}").with_suffix(".json"),
    params:
        spec=config["evalnet"],
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "train_evalnet", "{dataset}"),
    benchmark:
        paths.benchmark(RESULTS, "train_evalnet", "{dataset}")
    conda:
        "../envs/fedleak.yaml"
    resources:
        **cluster_resources("train_evalnet"),
    shell:
        "fedleak train-evalnet --config {params.config} --dataset {wildcards.dataset}"
        " 2>&1 | tee {log}"
