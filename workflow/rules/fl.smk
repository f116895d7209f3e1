def case_dataset(wildcards):
    return fedleak_config.find_case(config, wildcards.case)["dataset"]


rule fl_run:
    input:
        code("data", "models", "fl", "defenses", "metrics"),
        data=lambda w: f"results/data/{case_dataset(w)}/manifest.json",
        evalnet=lambda w: f"results/evalnet/{case_dataset(w)}.pt",
    output:
        metrics="results/fl/{case}/{defense}/{strength}/seed{seed}/metrics.json",
        final="results/fl/{case}/{defense}/{strength}/seed{seed}/final.pt",
        checkpoint=f"results/fl/{{case}}/{{defense}}/{{strength}}/seed{{seed}}/round{config['attack']['round']}.pt",
    benchmark:
        "results/benchmarks/fl_run/{case}/{defense}/{strength}/seed{seed}.tsv"
    params:
        fl=config["fl"],
        case=lambda w: fedleak_config.find_case(config, w.case),
        defense=lambda w: fedleak_config.defense_params(config, w.defense),
        data=lambda w: f"results/data/{case_dataset(w)}",
    resources:
        mem_mb=2000,
    shell:
        "fedleak fl-run --config {CONFIG_JSON} --case {wildcards.case}"
        " --defense {wildcards.defense} --strength {wildcards.strength} --seed {wildcards.seed}"
        " --data {params.data} --evalnet {input.evalnet} --out-dir results/fl/{wildcards.case}/{wildcards.defense}/{wildcards.strength}/seed{wildcards.seed}"
