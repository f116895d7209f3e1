ATTACKS = sorted(config["attacks"])
ATTACK_RUN = "results/attacks/{case}/{defense}/{strength}"
GIML_OPTION = " --giml-generator {input.giml}" if "giml" in ATTACKS else ""


rule attack:
    # One job per defense setting and seed: every configured attack against the same
    # defended uploads (one process, one torch start-up, instead of one per attack).
    input:
        code("data", "models", "fl", "defenses", "attacks", "metrics"),
        data=lambda w: f"results/data/{case_dataset(w)}/manifest.json",
        checkpoint=f"results/fl/{{case}}/{{defense}}/{{strength}}/seed{{seed}}/round{config['attack']['round']}.pt",
        evalnet=lambda w: f"results/evalnet/{case_dataset(w)}.pt",
        generator=f"results/gan/{config['gan']['dataset']}.pt",
        giml=lambda w: [f"results/giml/{w.case}.pt"] if "giml" in ATTACKS else [],
    output:
        metrics=expand(ATTACK_RUN + "/{attack}/seed{{seed}}/metrics.json", attack=ATTACKS, allow_missing=True),
        recon=expand(ATTACK_RUN + "/{attack}/seed{{seed}}/recon.png", attack=ATTACKS, allow_missing=True),
    benchmark:
        "results/benchmarks/attack/{case}/{defense}/{strength}/seed{seed}.tsv"
    params:
        attack=config["attack"],
        specs={name: fedleak_config.attack_params(config, name) for name in ATTACKS},
        defense=lambda w: fedleak_config.defense_params(config, w.defense),
        data=lambda w: f"results/data/{case_dataset(w)}",
        fl_dir=lambda w, input: str(Path(input.checkpoint).parent),
        attacks=" ".join(ATTACKS),
    resources:
        mem_mb=4000,
    shell:
        "fedleak attack --config {CONFIG_JSON} --case {wildcards.case} --attacks {params.attacks}"
        " --defense {wildcards.defense} --strength {wildcards.strength} --seed {wildcards.seed}"
        " --data {params.data} --fl-dir {params.fl_dir} --evalnet {input.evalnet}"
        " --generator {input.generator} --out-dir"
        " results/attacks/{wildcards.case}/{wildcards.defense}/{wildcards.strength}" + GIML_OPTION
