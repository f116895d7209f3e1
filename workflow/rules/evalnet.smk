rule train_evalnet:
    input:
        code("data", "models"),
        public=lambda w: f"results/data/{config['evalnet']['dataset']}/manifest.json",
        target="results/data/{dataset}/manifest.json",
    output:
        model="results/evalnet/{dataset}.pt",
        meta="results/evalnet/{dataset}.json",
    benchmark:
        "results/benchmarks/train_evalnet/{dataset}.tsv"
    params:
        spec=config["evalnet"],
    resources:
        mem_mb=4000,
    shell:
        "fedleak train-evalnet --config {CONFIG_JSON} --dataset {wildcards.dataset}"
        " --public-data results/data/{config[evalnet][dataset]}"
        " --target-data results/data/{wildcards.dataset} --out {output.model}"
