"""Each paper's claims as its configuration states them (decision 0105): in the paper's
own words, each with its regime, refused when they name what the targets lack, planned at
the reduced scale as the rows they read, and written as docs/verdicts.md."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from conftest import REPO
from test_claims import _judged

from gradleak import cli
from gradleak import config as cfg
from gradleak.data.datasets import load
from gradleak.experiment import claim_rows, claims, configuration, plan
from gradleak.report.verdicts import REGIME_COLUMNS
from gradleak.utils.metric_kinds import kind_of

PAPERS = ("refiner", "gias", "epafl", "censor", "recupfl")
LEAST = {"refiner": 32, "gias": 26, "epafl": 19, "censor": 18, "recupfl": 22}


def _raw(paper: str) -> dict:
    return cfg.read(REPO / "config" / "paper" / f"{paper}.yaml")


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize("paper", PAPERS)
def test_each_paper_states_its_claims_in_its_own_words(paper):
    config = configuration.validate(_raw(paper))
    smoke = configuration.validate({**_raw(paper), "scale": "smoke"})
    text = _words((REPO.parent / "shared" / "papers" / f"{paper}.txt").read_text()) \
        if (REPO.parent / "shared" / "papers").is_dir() else None
    assert config["paper"] and len(config["claims"]) >= LEAST[paper]
    assert len(smoke["claims"]) == len(config["claims"])
    for claim in config["claims"]:
        assert len(claim["statement"].split()) <= 30, claim["id"]
        if text is not None:  # the papers' text, where this checkout has it beside
            assert _words(claim["statement"]) in text, claim["id"]
        if "between" in claim["expect"]:
            assert claim["reason"], claim["id"]


def test_at_least_a_hundred_claims_over_the_five_papers():
    assert sum(len(configuration.validate(_raw(p))["claims"]) for p in PAPERS) >= 100


@pytest.mark.parametrize("paper", PAPERS)
def test_every_attack_a_claim_reads_has_its_undefended_regime(paper):
    config = configuration.validate(_raw(paper))
    covered = {a for e in config["regime"]["reconstructs"] for a in e["attacks"]}
    for claim in config["claims"]:
        if claim.get("requires", {}).get("reconstructs") is not None:
            continue
        kind = kind_of(claim["metric"], claim["target"] in plan.studies(config))
        if kind == "attack":
            assert claims.attacks_read(config, claim) <= covered, claim["id"]
    utility = [c for c in config["claims"] if kind_of(c["metric"]) == "utility"]
    assert not utility or config["regime"]["learns"], paper


@pytest.mark.parametrize("change, message", [
    ({"target": "fig1"}, "'target' 'fig1' is not a target with a table"),
    ({"metric": "lpips"}, "'metric' 'lpips' is not a metric of table5's table"),
    ({"of": {"round": 1}}, "'of' names 'round'; expected keys of table5's table"),
    ({"expect": {"=": 1}}, "claims"),
    ({"expect": {"between": [0, 1]}}, "claims"),  # a band without its reason
    ({"requires": {"reconstructs": ["nothing"]}},
     "'requires.reconstructs' names 'nothing'; expected one of regime.reconstructs's ids"),
    ({"by": "ratio"}, "'by' ratio of a rate (asr); expected difference"),
    ({"of": {"series": "EPAFLX"}},
     "'of' {series: 'EPAFLX'} is no row of table5 (its series values: ['DLG', 'EPAFL', "
     "'iDLG'])"),
    ({"to": {"dataset": "svhn"}},
     "'to' {dataset: 'svhn'} is no row of table5 (its dataset values: ['cifar10', 'mnist'])"),
    ({"expect": {"between": [0.1, -0.1]}, "reason": "r"},
     "'expect.between' [0.1, -0.1] has its ends reversed; expected [low, high]"),
])
def test_a_bad_claim_is_refused_naming_it(change, message):
    epafl = _raw("epafl")
    plain = next(c for c in epafl["claims"] if c["id"] == "asr-outperform")  # no reason:
    bad = [{**plain, **change}]
    with pytest.raises(cfg.ConfigError, match=re.escape(message)):
        configuration.validate({**epafl, "claims": bad})
    twice = [epafl["claims"][0], epafl["claims"][0]]
    with pytest.raises(cfg.ConfigError, match="the id is used twice"):
        configuration.validate({**epafl, "claims": twice})
    with pytest.raises(cfg.ConfigError, match=re.escape("'left_out.nope': not a claim's id")):
        configuration.validate({**epafl, "left_out": {"nope": "too costly"}})
    entry = {**epafl["regime"]["reconstructs"][0], "floor": 54}
    with pytest.raises(cfg.ConfigError, match=re.escape(
            "(idlg-undefended-mnist): a bound of 54 on asr, a share; expected one in [0, 1]")):
        configuration.validate({**epafl, "regime": {**epafl["regime"], "reconstructs": [entry]}})
    chance = {**epafl["regime"]["reconstructs"][0], "above_chance": 0.1}
    with pytest.raises(cfg.ConfigError, match=re.escape(
            "(idlg-undefended-mnist): 'above_chance' on asr; expected it only on attribute_asr")):
        configuration.validate({**epafl, "regime": {**epafl["regime"], "reconstructs": [chance]}})


def test_a_claim_requires_the_regime_of_its_own_case():
    """GIAS's wrong-prior claim requires its case's regime (GI-x and GIML's GI-z on FFHQ):
    that entry of ImageNet instead is refused, naming both datasets."""
    gias = _raw("gias")
    moved = [{**c, "requires": {"reconstructs": ["gix-undefended"]}}
             if c["id"] == "wrong-z-fails" else c for c in gias["claims"]]
    with pytest.raises(cfg.ConfigError, match=re.escape(
            "(wrong-z-fails): 'requires.reconstructs' names 'gix-undefended', the regime on "
            "['imagenet'], but the claim's rows are on ['ffhq']; expected an entry of their "
            "datasets")):
        configuration.validate({**gias, "claims": moved})


def test_the_reduced_scale_plans_the_rows_the_claims_read():
    full = configuration.validate(_raw("epafl"))
    reduced = configuration.validate({**_raw("epafl"), "scale": "reduced"})
    assert reduced["attack"]["victims"]["count"] == 16
    assert reduced["full_scale"]["attack.victims.count"] == 100
    assert plan.targets(reduced) == ["table1", "table2", "table4", "table5", "stoppers"]
    assert len(plan.jobs(reduced)) < len(plan.jobs(full))
    rows = claim_rows.read_rows(reduced)
    for point in plan.points(reduced):  # each planned point is a row a claim reads
        keys = plan.point_keys(reduced, point)
        assert any(claim_rows._matches(keys, row) for row in rows[point.target]), point
    assert "only the rows the claims and regime entries read are planned" in \
        claims.scale_conditions(reduced)
    assert claims.scale_conditions(full) == ""
    assert claims.claim_data(reduced)["time-mnist"] == "paper"  # the real MNIST test set
    assert claims.claim_data(reduced)["time-cifar10"] == "stand-in"


def test_the_reduced_scale_plans_only_the_regime_its_planned_claims_require():
    """Refiner leaves out every claim on ResNet-18, SVHN, CIFAR-100 and the non-IID split:
    their regime entries' rows (Figs. 11-13) are not planned; leaving out every claim but
    one study plans no regime row at all."""
    raw = _raw("refiner")
    reduced = configuration.validate({**raw, "scale": "reduced"})
    required = {e["id"] for e in claim_rows.required_entries(reduced)}
    assert required == {"idlg-lenet-cifar10", "gi-lenet-cifar10", "ig-lenet-cifar10",
                        "gga-lenet-cifar10", "fl-lenet-cifar10", "fl-lenet-centralised"}
    assert not {"fig11", "fig12", "fig13"} & set(plan.targets(reduced))
    only_study = {c["id"]: "left out" for c in raw["claims"] if c["id"] != "shift-mse-above-noise"}
    study = configuration.validate({**raw, "scale": "reduced", "reduced_overrides": {
        **raw["reduced_overrides"], "left_out": only_study}})
    assert claim_rows.required_entries(study) == []
    assert plan.targets(study) == ["fig3"]


def test_an_attack_claim_plans_only_the_regime_of_the_attacks_it_reads():
    """CENSOR's reduced scale leaves out every claim reading Inverting Gradients or
    GradInversion: their undefended rows are not planned, the generator attacks' are."""
    reduced = configuration.validate({**_raw("censor"), "scale": "reduced"})
    required = {e["id"] for e in claim_rows.required_entries(reduced)}
    assert required == {f"{a}-undefended-{d}" for a in ("ggl", "gias", "gifd")
                        for d in ("imagenet", "ffhq", "cifar10")} | {"fl-undefended-cifar10"}
    assert {a for p in plan.points(reduced) for a in p.attacks} == {"gga", "gias", "gifd"}


def test_a_matched_claim_plans_its_baseline_s_whole_curve_from_the_undefended_run():
    """RecUP-FL's best-tradeoff-lfw against DP (Gaussian) at RecUP-FL's learning loss plans
    every DP strength (each with its paired clip) and the undefended run, not only the
    one named; without `matched` only the named pair."""
    raw = _raw("recupfl")
    claim = next(c for c in raw["claims"] if c["id"] == "best-tradeoff-lfw")

    def planned(one: dict) -> set[str]:
        config = configuration.validate({**raw, "scale": "reduced", "claims": [one],
                                         "reduced_overrides": {**raw["reduced_overrides"],
                                                               "left_out": {}}})
        return {p.setting.text for p in plan.points(config) if p.target == "fig11"}

    assert claim["matched"] == "learning_loss"
    curve = planned(claim)
    dp = {s for s in curve if s.startswith("dp_gaussian")}
    assert len(dp) == 5 and "none-0" in curve
    assert not any(s.startswith(("dp_laplace", "pruning", "soteria")) for s in curve)
    named = {k: v for k, v in claim.items() if k not in ("matched", "matched_within")}
    assert {s for s in planned(named) if s.startswith("dp_gaussian")} < dp


def test_a_budget_cut_on_the_paper_s_value_needs_that_value_less_1_db():
    """Decision 0110: where the scale cuts an entry's attack under `converged.basis:
    paper_value`, the verdicts' floor is the paper's value less 1 dB; uncut, the floor."""
    raw = _raw("censor")
    judged = {e["id"]: e for e in claims.judged_regime(
        configuration.validate({**raw, "scale": "reduced"}))["reconstructs"]}
    assert judged["gifd-undefended-imagenet"]["floor"] == pytest.approx(21.364 - 1)
    assert judged["ggl-undefended-ffhq"]["floor"] == pytest.approx(14.167 - 1)
    assert judged["ig-undefended-imagenet"]["floor"] == 11.819  # no converged: its floor
    full = configuration.validate(raw)
    assert claims.judged_regime(full) == full["regime"]
    entries = [dict(e) for e in raw["regime"]["reconstructs"]]
    entries[7]["paper"] = None
    with pytest.raises(cfg.ConfigError, match="'converged.basis' paper_value needs the "
                                              "paper's value and a floor"):
        configuration.validate({**raw, "regime": {**raw["regime"], "reconstructs": entries}})


def test_what_a_scale_cannot_decide_is_known_before_any_job():
    raw = _raw("epafl")
    smoke = claims.construction(configuration.validate({**raw, "scale": "smoke"}))
    assert all(r[0] == "smoke scale: stand-ins and budgets that test the wiring"
               for r in smoke.values())
    assert "idlg runs 5 of the paper's 300 iterations" in smoke["time-mnist"]
    cut = configuration.validate({**raw, "scale": "reduced", "reduced_overrides": {
        **raw["reduced_overrides"], "attacks": {"idlg": {"iterations": 100}},
        "left_out": {"time-cifar10": "needs 9 CPU-hours"}}})
    reasons = claims.construction(cut)
    assert reasons["time-mnist"] == ["idlg runs 100 of the paper's 300 iterations"]
    assert reasons["time-cifar10"] == ["left out at this scale: needs 9 CPU-hours"]
    assert reasons["threshold-cost"] == []
    lines = claims.untestable_lines(cut)
    assert lines[0] == ("claim time-mnist is untestable at scale reduced: idlg runs 100 of "
                        "the paper's 300 iterations")
    refiner = configuration.validate({**_raw("refiner"), "fl": {"seeds": [0]}})
    assert any("1 FL seed planned" in r for r in sum(claims.construction(refiner).values(), []))


def test_the_natural_stand_in_is_photo_crops_in_the_dataset_s_shape():
    data = load("cifar10", stand_in="natural", max_images=300)
    assert tuple(data.x.shape) == (300, 3, 32, 32) and data.num_classes == 10
    assert set(data.y.tolist()) == set(range(10))
    assert float(data.x.std()) > 0.1  # photographs, not a flat fill
    assert tuple(load("mnist", stand_in="natural", max_images=4).x.shape) == (4, 1, 28, 28)


def test_verdicts_are_written_from_kept_runs(tmp_path, capsys):
    judged = _judged({"metric": "psnr", "of": {"defense": "refiner"},
                      "to": {"defense": "soteria"}, "expect": {"<": 0},
                      "statement": "it works"})
    pd.DataFrame([judged]).to_csv(tmp_path / "p.csv", index=False)
    assert cli.main(["verdicts", str(tmp_path / "p.csv")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Verdicts") and "## P" in text and "**1 holds (of 1)**." in text
    assert "configuration states none" in text  # no regime.csv beside it
    regime = pd.DataFrame([{"entry": "ig", "requirement": "reconstructs", "attacks": "ig",
                            "datasets": "", "target": "t", "of": "defense none",
                            "metric": "psnr", "bound": ">= 18", "paper": 24.0,
                            "source": "Table 10", "ours": 23.2, "ci_low": 22.0,
                            "ci_high": 24.3, "n": 6, "in_regime": "yes"}],
                          columns=REGIME_COLUMNS)
    regime.to_csv(tmp_path / "p-regime.csv", index=False)
    (tmp_path / "p.run.json").write_text(json.dumps(
        {"commit": "abc1234", "command": "snakemake --config scale=reduced",
         "cpu_hours": 1.25}))
    (tmp_path / "p.md").write_text("every attack reconstructs here.\n")
    assert cli.main(["verdicts", str(tmp_path / "p.csv")]) == 0
    noted = capsys.readouterr().out
    assert "| undefended ig (psnr) | t: defense none | 23.2 [22, 24.3]" in noted
    assert "Run: commit `abc1234`, scale reduced, `snakemake --config scale=reduced`, " \
           "1.25 CPU-hours." in noted
    assert noted.endswith("Reading these verdicts: every attack reconstructs here.\n")
    (tmp_path / "bad.csv").write_text("claim,ours\na,1\n")
    assert cli.main(["verdicts", str(tmp_path / "bad.csv")]) == 2
    assert "bad.csv: columns ['claim', 'ours'], expected" in capsys.readouterr().err


def test_a_run_made_in_parts_is_one_section_with_each_claim_from_the_part_that_ran_it(
        tmp_path, capsys):
    """Two parts of one paper, each leaving the other's claim out: one section, both claims
    judged, both parts' commits and commands under it."""
    judged = _judged({"metric": "psnr", "of": {"defense": "refiner"},
                      "to": {"defense": "soteria"}, "expect": {"<": 0},
                      "statement": "it works"}).to_dict()
    left = {**judged, "verdict": "untestable", "why": "left out at this scale: another part"}
    for part, rows, commit in (("a", [left, {**judged, "claim": "d"}], "aaa1111"),
                               ("b", [judged, {**left, "claim": "d"}], "bbb2222")):
        pd.DataFrame(rows).to_csv(tmp_path / f"p-{part}.csv", index=False)
        (tmp_path / f"p-{part}.run.json").write_text(json.dumps(
            {"commit": commit, "command": f"snakemake part {part}", "cpu_hours": 1.0}))
    assert cli.main(["verdicts", str(tmp_path / "p-a.csv"), str(tmp_path / "p-b.csv")]) == 0
    text = capsys.readouterr().out
    assert text.count("## P") == 1 and "**2 hold (of 2)**." in text
    assert text.index("| c ") < text.index("| d ")  # the claims in the first part's order
    assert "Run: commit `aaa1111`, then `bbb2222`, scale reduced, `snakemake part a`, then " \
           "`snakemake part b`, 2 CPU-hours." in text


def test_docs_verdicts_is_what_gradleak_verdicts_writes_from_the_kept_runs(capsys):
    runs = sorted(p for p in (REPO / "docs" / "verdicts").glob("*.csv")
                  if not p.stem.endswith("-regime"))
    assert runs  # at least one reduced run's claims.csv
    assert cli.main(["verdicts", *map(str, runs)]) == 0
    assert capsys.readouterr().out == (REPO / "docs" / "verdicts.md").read_text()


def test_gradleak_validate_lists_what_the_scale_cannot_decide(capsys):
    config = str(REPO / "config" / "paper" / "epafl.yaml")
    assert cli.main(["validate", "--config", config, "--scale", "smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(": OK (17 settings, 5 attacks, 2 cases)")
    assert len(lines) == 1 + len(_raw("epafl")["claims"])
    assert lines[1].startswith("claim time-mnist is untestable at scale smoke: smoke scale")
    assert cli.main(["validate", "--config", config]) == 0
    assert capsys.readouterr().out.count("\n") == 1  # the full scale cannot be cut


def test_a_run_leaves_out_more_claims_on_top_of_its_scales_with_dots_in_their_ids():
    """`--config 'left_out={...}'` adds to the reduced scale's own left_out (whose ids, such
    as GIAS's noise-always-0.001, hold dots): the union is left out, nothing of it planned."""
    raw = _raw("gias")
    giml = [c["id"] for c in raw["claims"] if c["target"] == "fig6"]
    config = configuration.validate({**raw, "scale": "reduced",
                                     "left_out": {i: "a second run" for i in giml}})
    assert set(giml) | set(raw["reduced_overrides"]["left_out"]) == set(config["left_out"])
    assert "fig6" not in plan.targets(config)


def test_a_claim_plans_only_the_regime_entries_on_its_target_s_datasets():
    """RecUP-FL's Adult claims (Fig. 10) need Adult's adversaries and FL, not LFW's,
    AudioMNIST's or CelebA's entries: a run of them alone plans none of those."""
    raw = _raw("recupfl")
    others = {c["id"]: "another part" for c in raw["claims"] if c["target"] != "fig10"}
    config = configuration.validate({**raw, "scale": "reduced", "left_out": others})
    required = {e["id"] for e in claim_rows.required_entries(config)}
    assert required == {f"{a}-undefended-adult" for a in ("stru-nn", "unkwn-nn", "svm", "rf")
                        } | {"fl-undefended-adult"}


def test_a_same_loss_tolerance_needs_the_side_its_claim_must_beat():
    """``matched_within`` reads the baseline's point least favourable to the claim, which
    only a one-sided ``expect`` names; without ``matched`` it means nothing."""
    recupfl = _raw("recupfl")
    matched = next(c for c in recupfl["claims"] if "matched" in c)
    band = {**matched, "matched_within": 1e-3, "expect": {"between": [-0.1, 0.1]},
            "reason": "r"}
    with pytest.raises(cfg.ConfigError, match=re.escape(
            "'matched_within' with expect {'between': [-0.1, 0.1]}; expected '<' or '>'")):
        configuration.validate({**recupfl, "claims": [band]})
    alone = {k: v for k, v in matched.items() if k != "matched"} | {"matched_within": 1e-3}
    with pytest.raises(cfg.ConfigError, match="claims"):
        configuration.validate({**recupfl, "claims": [alone]})
