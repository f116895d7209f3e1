rule attack:
    input:
        code("data", "models", "fl", "defenses", "attacks", "metrics"),
        data=lambda w: f"results/data/{case_dataset(w)}/manifest.json",
        checkpoint=f"results/fl/{{case}}/{{defense}}/{{strength}}/seed{{seed}}/round{config['attack']['round']}.pt",
        evalnet=lambda w: f"results/evalnet/{case_dataset(w)}.pt",
    output:
        metrics="results/attacks/{case}/{defense}/{strength}/{attack}/seed{seed}/metrics.json",
        recon="results/attacks/{case}/{defense}/{strength}/{attack}/seed{seed}/recon.png",
    params:
        attack=config["attack"],
        spec=lambda w: fedleak_config.attack_params(config, w.attack),
        defense=lambda w: fedleak_config.defense_params(config, w.defense),
        data=lambda w: f"results/data/{case_dataset(w)}",
        fl_dir=lambda w, input: str(Path(input.checkpoint).parent),
    resources:
        mem_mb=4000,
    shell:
        "fedleak attack --config {CONFIG_JSON} --case {wildcards.case} --attack {wildcards.attack}"
        " --defense {wildcards.defense} --strength {wildcards.strength} --seed {wildcards.seed}"
        " --data {params.data} --fl-dir {params.fl_dir} --evalnet {input.evalnet}"
        " --out-dir results/attacks/{wildcards.case}/{wildcards.defense}/{wildcards.strength}/{wildcards.attack}/seed{wildcards.seed}"
