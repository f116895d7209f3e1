rule train_gan:
    input:
        code("data", "models"),
        data="results/data/{dataset}/manifest.json",
    output:
        model="results/gan/{dataset}.pt",
        samples="results/gan/{dataset}.png",
        log="results/gan/{dataset}.json",
    benchmark:
        "results/benchmarks/train_gan/{dataset}.tsv"
    params:
        spec=config["gan"],
    resources:
        mem_mb=4000,
    shell:
        "fedleak train-gan --config {CONFIG_JSON} --data results/data/{wildcards.dataset}"
        " --out {output.model}"


rule train_giml:
    # GIML: a generator meta-learned from client gradients of the undefended FL run.
    input:
        code("data", "models", "fl", "attacks"),
        data=lambda w: f"results/data/{case_dataset(w)}/manifest.json",
        checkpoint=f"results/fl/{{case}}/none/0/seed{config['attack']['seeds'][0]}/round{config['attack']['round']}.pt",
    output:
        model="results/giml/{case}.pt",
        samples="results/giml/{case}.png",
        log="results/giml/{case}.json",
    benchmark:
        "results/benchmarks/train_giml/{case}.tsv"
    params:
        spec=config["giml"],
        data=lambda w: f"results/data/{case_dataset(w)}",
        fl_dir=lambda w, input: str(Path(input.checkpoint).parent),
    resources:
        mem_mb=4000,
    shell:
        "fedleak train-giml --config {CONFIG_JSON} --case {wildcards.case} --data {params.data}"
        " --fl-dir {params.fl_dir} --out {output.model}"
