rule aggregate:
    input:
        code("report", "metrics"),
        fl=TARGETS["fl"],
        attacks=TARGETS["attacks"],
        evalnet=TARGETS["evalnet"],
    output:
        tables=expand(
            "results/tables/{table}.csv",
            table=["utility", "privacy", "tradeoff", "evalnet_monotonicity"],
        ),
        figures=expand(
            "results/figures/{kind}_{attack}.png",
            kind=["pmm_vs_psnr", "recon"],
            attack=sorted(config["attacks"]),
        ),
        report="results/report.md",
    shell:
        "fedleak aggregate --config {CONFIG_JSON} --results results"
