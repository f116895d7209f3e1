rule prepare_data:
    input:
        code("data"),
    output:
        manifest=paths.data_manifest(RESULTS, "{dataset}"),
    params:
        spec=lambda w: config["datasets"][w.dataset],
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "prepare_data", "{dataset}"),
    benchmark:
        paths.benchmark(RESULTS, "prepare_data", "{dataset}")
    conda:
        "../envs/fedleak.yaml"
    resources:
        **cluster_resources("prepare_data"),
    shell:
        "fedleak prepare-data --config {params.config} --dataset {wildcards.dataset}"
        " 2>&1 | tee {log}"
