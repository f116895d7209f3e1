"""Phase ``aggregate``: the standard tables and figures of every FL, attack and attribute
job and ``report.md`` (what stands in for the paper's data and priors, every target's
result). It reads the outputs of every job of the phases it gathers."""

from __future__ import annotations

from pathlib import Path

from gradleak import attacks
from gradleak.data.datasets import SHAPES
from gradleak.experiment import claims, paths, pipeline, plan, priors
from gradleak.experiment.phase import Output, Phase
from gradleak.needs import artifact_parts
from gradleak.settings import UNDEFENDED, Setting, protocol_of

GATHERS = ("fl_run", "attack", "train_evalnet", "attribute", "target")
# each with its caption, workflow/report/<kind>.rst
FIGURE_KINDS = ("pmm_vs_psnr", "tradeoff", "censor", "recon", "evalnet", "attribute",
                "matched_utility", "protocol_ranking")


def tables(config: dict, jobs: pipeline.Jobs) -> list[str]:
    """The standard tables: every FL and attack run of the plan, row by row and summarised."""
    names = ["utility", "privacy", "tradeoff", "timing"]
    if not config["targets"] and plan.attack_jobs(config):
        names.append("censor_table")
        if set(config["defenses"]) - {plan.NONE.defense}:  # every defense at matched utility
            names.append("matched_utility")
            if len(config["protocols"]) > 1:  # the protocols' rankings side by side
                names.append("protocol_ranking")
    if jobs.get("train_evalnet"):
        names.append("evalnet_monotonicity")
    if plan.attribute_jobs(config):
        names += ["attribute", "attribute_gap"]
    return names


def figures(config: dict, jobs: pipeline.Jobs) -> list[str]:
    """The standard figures of a configuration without targets (its targets draw their own)."""
    if config["targets"]:
        return []
    made = tables(config, jobs)
    labels = plan.attack_labels(config) if plan.attack_jobs(config) else []
    return ([f"pmm_vs_psnr_{a}" for a in labels] + [f"recon_{a}" for a in labels]
            + [f"tradeoff_{m}" for m in ("psnr", "ssim", "lpips", "stlpips", "noise_ratio")
               if labels]
            + (["censor_tradeoff"] if "censor_table" in made else [])
            + (["matched_utility"] if "matched_utility" in made else [])
            + (["protocol_ranking"] if "protocol_ranking" in made else [])
            + (["evalnet_monotonicity"] if "evalnet_monotonicity" in made else [])
            + (["attribute_tradeoff"] if "attribute" in made else []))


def substitutions(config: dict) -> list[str]:
    """What stands in for the paper's data and generative priors in this configuration
    (report.md says it beside the results)."""
    gan = config["gan"]
    priors_of = sorted({of or gan["dataset"] for label in config["attacks"]
                        for kind, of in map(artifact_parts, attacks.needs(
                            *plan.attack_of(config, label)).values()) if kind == "gan"}
                       - set(priors.pretrained_datasets(config)))  # DCGANs trained here
    lines = []
    for name in sorted({case["dataset"] for case in config["cases"]} | set(priors_of)):
        kind = config["datasets"].get(name, {}).get("stand_in")
        if kind:
            c, h, w, classes = SHAPES[name]
            source = {"digits": "scikit-learn's bundled digits, resized, with their 10 labels",
                      "natural": "crops of scikit-image's bundled photographs, labelled by "
                                 "photograph",
                      "fake": "torchvision's FakeData noise"}[kind]
            lines.append(f"`{name}` ({c}x{h}x{w}, {classes} classes) is the `{kind}` stand-in: "
                         f"{source}, not {name}'s images.")
    if priors_of:
        lines.append(f"Generative priors: DCGANs ({gan['latent_dim']}-d latent, width "
                     f"{gan['width']}, {gan['resolution']}x{gan['resolution']}, resized to "
                     f"the model's input) trained in the pipeline on the {gan['split']} split "
                     f"of {', '.join(priors_of)}"
                     + (" (the priors an attack's prior_dataset names that gan: loads from "
                        "no file)." if priors.pretrained(config) else
                        ", in place of the papers' pretrained StyleGAN2/BigGAN."))
    return lines


def substituted_keys(config: dict, results: Path) -> list[str]:
    """The configuration paths at which this configuration's plan replaces the paper's own:
    a dataset's stand-in, DCGAN priors trained in the pipeline in place of a pretrained kind
    (a prior_dataset's DCGAN beside a pretrained prior is the configuration's choice), an
    evaluation network trained on the bundled natural images."""
    jobs = pipeline.walk(config, results)
    datasets = {case["dataset"] for case in config["cases"]} | {
        job["dataset"] for job in jobs["train_gan"]}
    keys = [f"datasets.{name}.stand_in" for name in sorted(datasets)
            if config["datasets"].get(name, {}).get("stand_in")]
    keys += ["gan.kind"] if jobs["train_gan"] and not priors.pretrained(config) else []
    keys += ["evalnet.dataset"] if jobs["train_evalnet"] \
        and config["evalnet"]["dataset"] == "natural" else []
    return keys


def undeclared_departures(config: dict, results: Path) -> list[str]:
    """The substituted keys (:func:`substituted_keys`) that no ``departures:`` entry names."""
    named = {departure.get("key") for departure in config["departures"]}
    return [key for key in substituted_keys(config, results) if key not in named]


def protocol_names(config: dict) -> dict[str, str]:
    """Each of ``protocols:``' overrides as the setting labels carry them (empty: as
    configured) -> the protocol's name; the one without overrides first, the others by
    their overrides (the resolved configuration keeps no order of its keys)."""
    return dict(sorted(
        (protocol_of(plan.normalize(config, Setting.of(UNDEFENDED, 0, overrides)).label), name)
        for name, overrides in (config["protocols"] or {}).items()))


def aggregate(config: dict, results: Path) -> None:
    """The standard tables and figures and report.md (with every target's result)."""
    # Imported by the job, not with the declaration: every Snakemake start (and each
    # SLURM job's) loads every phase's declaration, and the report's plotting stack
    # (seaborn, scipy.stats) takes 2-3 s to import. experiment.code counts it all the same.
    from gradleak import report

    jobs = pipeline.walk(config, results)

    def files(name: str) -> list[Path]:
        return [p for p in pipeline.outputs_of(config, results, [name], jobs)
                if p.name == "metrics.json"]

    evalnet_json = [p for p in pipeline.outputs_of(config, results, ["train_evalnet"], jobs)
                    if p.suffix == ".json"]
    names = tables(config, jobs)
    made = report.write_tables(files("fl_run"), files("attack"), evalnet_json,
                               results / "tables", [n for n in names if "attribute" not in n],
                               stronger=report.defense_directions(config),
                               protocols=protocol_names(config))
    if "attribute" in names:
        made.update(report.write_attribute_tables(files("attribute"), results / "tables"))
    drawn = report.write_figures(made, files("attack"), results / "figures",
                                 figures(config, jobs))
    targets = [report.load_target(paths.target_dir(results, name))
               for name in plan.targets(config)]
    judged = regime = None
    if config["claims"]:
        judged, regime = report.claims_table(
            config["claims"], [t.claims for t in targets if t.claims is not None],
            claims.judged_regime(config), claims.construction(config), set(plan.studies(config)),
            config["paper"] or config["title"], claims.claim_data(config), config["scale"],
            claims.scale_conditions(config))
        report.write_csv(judged, paths.claims(results))
        report.write_csv(regime, paths.regime(results))
    report.write_report(made, drawn, targets, paths.report(results), title=config["title"],
                        substitutions=substitutions(config), departures=config["departures"],
                        claims=judged, regime=regime)


def _outputs(config: dict, results: Path, jobs: pipeline.Jobs | None) -> dict:
    jobs = jobs or pipeline.walk(config, results)
    return {
        "report": Output(paths.report(results)),
        **({"claims": Output(paths.claims(results), caption="table", category="Tables",
                             labels={"table": "claims"}),
            "regime": Output(paths.regime(results), caption="table", category="Tables",
                             labels={"table": "regime"})} if config["claims"] else {}),
        "tables": [Output(paths.table(results, t), caption="table", category="Tables",
                          labels={"table": t}) for t in tables(config, jobs)],
        "figures": [Output(paths.figure(results, f), category="Figures", labels={"figure": f},
                           caption=next(k for k in FIGURE_KINDS if f.startswith(k)))
                    for f in figures(config, jobs)]}


PHASE = Phase(
    name="aggregate",
    summary="the standard tables and figures, and report.md",
    wildcards=(),
    folders=("tables", "figures", "report.md"),
    reads=GATHERS,
    outputs=_outputs,
    run=aggregate,
    gathers=GATHERS,
    params=lambda config, results, job: {k: config[k] for k in (
        "title", "attack", "paper", "claims", "regime", "left_out", "scale")},
    work=lambda config, results, job: {
        "figure": len(figures(config, pipeline.walk(config, results)))},
    startup="startup:figures",
)
