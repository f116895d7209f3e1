rule prepare_data:
    input:
        code("data"),
    output:
        manifest="results/data/{dataset}/manifest.json",
    params:
        spec=lambda w: config["datasets"][w.dataset],
    resources:
        mem_mb=2000,
    shell:
        "fedleak prepare-data --config {CONFIG_JSON} --dataset {wildcards.dataset}"
        " --out results/data/{wildcards.dataset}"
