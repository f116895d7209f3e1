rule aggregate:
    input:
        code("report", "metrics"),
        fl=TARGETS["fl"],
        attacks=TARGETS["attacks"],
        evalnet=TARGETS["evalnet"],
    output:
        tables=[report(t, caption="../report/table.rst", category="Tables",
                       labels={"table": t.stem})
                for t in tables()],
        pmm=[report(paths.figure(RESULTS, f"pmm_vs_psnr_{a}"), caption="../report/pmm_vs_psnr.rst",
                    category="Trade-off", labels={"figure": "PMM vs PSNR", "attack": a})
             for a in ATTACKS],
        tradeoff=[report(paths.figure(RESULTS, f"tradeoff_{m}"), caption="../report/tradeoff.rst",
                         category="Trade-off", labels={"figure": "PMM vs metric", "metric": m})
                  for m in ("psnr", "ssim", "lpips", "noise_ratio")],
        recon=[report(paths.figure(RESULTS, f"recon_{a}"), caption="../report/recon.rst",
                      category="Reconstructions", labels={"attack": a})
               for a in ATTACKS],
        evalnet=report(paths.figure(RESULTS, "evalnet_monotonicity"),
                       caption="../report/evalnet.rst", category="Evaluation network"),
        report=paths.report(RESULTS),
    params:
        config=CONFIG_JSON,
    log:
        paths.log(RESULTS, "aggregate", "report"),
    conda:
        "../envs/fedleak.yaml"
    shell:
        "fedleak aggregate --config {params.config} 2>&1 | tee {log}"
