rule target:
    # One paper table or figure (a `targets:` entry) from the runs it selects.
    input:
        code("report", "metrics"),
        target_inputs,
    output:
        report(
            directory(paths.target_dir(RESULTS, "{name}")),
            patterns=["{file}.png", "{file}.csv"],
            caption="../report/target.rst",
            category="Paper targets",
            subcategory="{name}",
        ),
    params:
        spec=target_params,
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "target", "{name}"),
    benchmark:
        paths.benchmark(RESULTS, "target", "{name}")
    resources:
        **cluster_resources("target"),
    conda:
        "../envs/fedleak.yaml"
    shell:
        "fedleak target --config {params.config} --name {wildcards.name} 2>&1 | tee {log}"


rule aggregate:
    input:
        code("report", "metrics"),
        fl=TARGETS["fl"],
        attacks=TARGETS["attacks"],
        evalnet=TARGETS["evalnet"],
        targets=TARGETS["targets"],
        attribute=TARGETS["attribute"],
    output:
        tables=[report(t, caption="../report/table.rst", category="Tables",
                       labels={"table": t.stem})
                for t in TARGETS["tables"]],
        figures=[report(f, caption=f"../report/{caption(f)}.rst", category="Figures",
                        labels={"figure": f.stem})
                 for f in TARGETS["figures"]],
        report=paths.report(RESULTS),
    params:
        spec=aggregate_params(),
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "aggregate", "report"),
    benchmark:
        paths.benchmark(RESULTS, "aggregate", "report")
    resources:
        **cluster_resources("aggregate"),
    conda:
        "../envs/fedleak.yaml"
    shell:
        "fedleak aggregate --config {params.config} 2>&1 | tee {log}"
