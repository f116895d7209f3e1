rule train_gan:
    input:
        code("data", "models"),
        data=paths.data_manifest(RESULTS, "{dataset}"),
    output:
        model=paths.gan_file(RESULTS, "{dataset}"),
        samples=report(
            paths.gan_file(RESULTS, "{dataset}").with_suffix(".png"),
            caption="../report/gan.rst",
            category="Priors",
        ),
        log=paths.gan_file(RESULTS, "{dataset}").with_suffix(".json"),
    params:
        spec=config["gan"],
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "train_gan", "{dataset}"),
    benchmark:
        paths.benchmark(RESULTS, "train_gan", "{dataset}")
    conda:
        "../envs/fedleak.yaml"
    resources:
        **cluster_resources("train_gan"),
    shell:
        "fedleak train-gan --config {params.config} --dataset {wildcards.dataset} 2>&1 | tee {log}"


rule train_giml:
    # GIML: a generator meta-learned from client gradients of the undefended FL run.
    input:
        code("data", "models", "fl", "defenses", "attacks"),
        data=case_data,
        checkpoint=giml_checkpoint,
    output:
        model=paths.giml_file(RESULTS, "{case}"),
        samples=report(
            paths.giml_file(RESULTS, "{case}").with_suffix(".png"),
            caption="../report/giml.rst",
            category="Priors",
        ),
        log=paths.giml_file(RESULTS, "{case}").with_suffix(".json"),
    params:
        spec=config["giml"],
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "train_giml", "{case}"),
    benchmark:
        paths.benchmark(RESULTS, "train_giml", "{case}")
    conda:
        "../envs/fedleak.yaml"
    resources:
        **cluster_resources("train_giml"),
    shell:
        "fedleak train-giml --config {params.config} --case {wildcards.case} 2>&1 | tee {log}"
