rule train_gan:
    input:
        code("data", "models"),
        data="results/data/{dataset}/manifest.json",
    output:
        model="results/gan/{dataset}.pt",
        samples="results/gan/{dataset}.png",
        log="results/gan/{dataset}.json",
    params:
        spec=config["gan"],
    resources:
        mem_mb=4000,
    shell:
        "fedleak train-gan --config {CONFIG_JSON} --data results/data/{wildcards.dataset}"
        " --out {output.model}"
