rule aggregate:
    input:
        code("report", "metrics"),
        fl=TARGETS["fl"],
        attacks=TARGETS["attacks"],
        evalnet=TARGETS["evalnet"],
    output:
        tables=expand(
            "results/tables/{table}.csv",
            table=["utility", "privacy", "tradeoff", "censor_table", "evalnet_monotonicity"]
            + (["ablation"] if config["ablations"] else []),
        ),
        figures=expand(
            "results/figures/{kind}_{attack}.png",
            kind=["pmm_vs_psnr", "recon"],
            attack=sorted(config["attacks"]),
        )
        + expand("results/figures/tradeoff_{metric}.png", metric=["psnr", "ssim", "lpips", "noise_ratio"]),
        report="results/report.md",
    shell:
        "fedleak aggregate --config {CONFIG_JSON} --results results"
