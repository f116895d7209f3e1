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
    conda:
        "../envs/fedleak.yaml"
    resources:
        mem_mb=2000,
    shell:
        "fedleak prepare-data --config {params.config} --dataset {wildcards.dataset}"
        " 2>&1 | tee {log}"
