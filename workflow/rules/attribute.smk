rule train_zoo:
    # RecUP-FL's defender models, on clean gradients of the undefended run at one round.
    input:
        code("data", "models", "adversaries"),
        data=case_data,
        checkpoint=zoo_checkpoint,
    output:
        paths.zoo_file(RESULTS, "{case}", "{seed}", "{round}"),
    params:
        spec=clean_attribute_spec(config["attribute"]),
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "train_zoo", "{case}", "seed{seed}", "round{round}"),
    benchmark:
        paths.benchmark(RESULTS, "train_zoo", "{case}", "seed{seed}", "round{round}")
    conda:
        "../envs/fedleak.yaml"
    # as soon as its checkpoint is there: RecUP-FL's jobs, the longest, wait on it
    priority: 2
    resources:
        **cluster_resources("train_zoo"),
    shell:
        "fedleak train-zoo --config {params.config} --case {wildcards.case}"
        " --seed {wildcards.seed} --round {wildcards.round} 2>&1 | tee {log}"


rule fit_adversaries:
    # The attribute adversaries with a saved form, fitted once under the round's model of
    # one setting and shared by the attribute jobs that learn under it (round 0: all).
    input:
        code("data", "models", "adversaries"),
        data=case_data,
        checkpoint=adversary_checkpoint,
    output:
        paths.adversaries_file(RESULTS, "{case}", "{setting}", "{seed}", "{round}"),
    params:
        spec=adversary_params,
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "fit_adversaries", "{case}", "{setting}", "seed{seed}",
                  "round{round}"),
    benchmark:
        paths.benchmark(RESULTS, "fit_adversaries", "{case}", "{setting}", "seed{seed}",
                        "round{round}")
    conda:
        "../envs/fedleak.yaml"
    resources:
        **cluster_resources("fit_adversaries"),
    shell:
        "fedleak fit-adversaries --config {params.config} --case {wildcards.case}"
        " --setting {wildcards.setting:q} --seed {wildcards.seed} --round {wildcards.round}"
        " 2>&1 | tee {log}"


rule attribute:
    # Every attribute adversary against one setting's defended uploads, at every round.
    input:
        code("data", "models", "fl", "defenses", "adversaries"),
        fl_inputs,
        fl=attribute_fl_metrics,
        adversaries=attribute_adversaries,
    output:
        paths.attribute_metrics(RESULTS, "{case}", "{setting}", "{seed}"),
    params:
        spec=attribute_params,
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "attribute", "{case}", "{setting}", "seed{seed}"),
    benchmark:
        paths.benchmark(RESULTS, "attribute", "{case}", "{setting}", "seed{seed}")
    conda:
        "../envs/fedleak.yaml"
    priority: trained_first
    resources:
        **cluster_resources("attribute"),
    shell:
        "fedleak attribute --config {params.config} --case {wildcards.case}"
        " --setting {wildcards.setting:q} --seed {wildcards.seed} 2>&1 | tee {log}"
