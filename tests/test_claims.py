"""Verdicts (issue 46): bootstrap intervals over victims and seeds, each paper's claims as
its configuration states them, and how a claim is judged from a target's results."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from conftest import REPO

from fedleak import cli
from fedleak import config as cfg
from fedleak.data.datasets import load
from fedleak.experiment import configuration, plan
from fedleak.report.claims import CLAIM_COLUMNS, claims_table, judge, summary_line, verdict
from fedleak.report.intervals import interval, replicates
from fedleak.report.targets import TargetInputs, build_table, source_of

# issue 46: at least this many claims per paper
LEAST = {"refiner": 6, "gias": 5, "epafl": 4, "censor": 4, "recupfl": 5}


def test_one_seed_s_interval_is_scipy_s_percentile_bootstrap():
    values = np.random.default_rng(3).normal(20.0, 4.0, 30)
    ours = interval(values)
    theirs = scipy.stats.bootstrap((values,), np.mean, method="percentile",
                                   random_state=0).confidence_interval
    spread = values.std() / np.sqrt(len(values))
    assert ours == pytest.approx((theirs.low, theirs.high), abs=0.15 * spread)
    assert ours == interval(values)  # a fixed seed: the same numbers, the same interval


def test_several_seeds_resample_the_seeds_first():
    # three FL runs whose victims differ by run: the runs' spread must widen the interval
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(m, 0.5, 10) for m in (10.0, 14.0, 18.0)])
    seeds = np.repeat([0, 1, 2], 10)
    pooled, clustered = interval(values), interval(values, seeds)
    assert clustered[1] - clustered[0] > 3 * (pooled[1] - pooled[0])


def test_no_interval_from_one_unit_and_a_rate_of_zero_is_not_certain():
    assert np.isnan(interval([12.0])).all()
    assert np.isnan(interval([12.0] * 6)).all()  # no spread seen is no interval
    low, high = interval(np.zeros(8), statistic="asr")
    assert low == 0.0 and 0.2 < high < 0.45  # Wilson's 95 % upper bound for 0/8: 0.32
    assert np.isnan(replicates([], statistic="mean")).all()


@pytest.mark.parametrize("low, high, expect, judged", [
    (-3.0, -1.0, {"<": 0}, "holds"), (1.0, 3.0, {"<": 0}, "fails"),
    (-1.0, 1.0, {"<": 0}, "inconclusive"), (0.7, 0.9, {">": 0.6}, "holds"),
    (0.1, 0.6, {">": 0.6}, "fails"), (np.nan, np.nan, {">": 0}, "inconclusive")])
def test_a_verdict_needs_the_whole_interval_on_one_side(low, high, expect, judged):
    assert verdict(low, high, expect) == judged


SPEC = {"rows": ["defense", "strength"], "metrics": ["psnr", "pmm", "asr"]}


def _inputs(psnr: dict[tuple, list[float]], pmm: dict[tuple, float]) -> TargetInputs:
    """Victim rows of one seed per (defense, strength), with that run's PMM."""
    rows = [{"case": "c", "defense": d, "strength": s, "series": None, "seed": 0,
             "attack": "ig", "victim": i, "psnr": p, "ssim": p / 40, "pmm": pmm[(d, s)]}
            for (d, s), values in psnr.items() for i, p in enumerate(values)]
    victims = pd.DataFrame(rows)
    return TargetInputs(victims, victims.drop_duplicates(["defense", "strength"]),
                        pd.DataFrame(), pd.DataFrame())


def _judge(claim: dict, inputs: TargetInputs) -> dict:
    claim = {"id": "c", "by": "difference", **claim}
    return judge(claim, SPEC, build_table(SPEC, inputs), source_of(inputs, SPEC["metrics"]))


RUNS = _inputs({("refiner", 0.1): [10, 11, 12, 11, 10, 12],
                ("refiner", 0.5): [8, 9, 8, 9, 8, 9],
                ("soteria", 0.5): [20, 21, 19, 20, 21, 19],
                ("soteria", 0.9): [19, 20, 21, 20, 19, 21]},
               {("refiner", 0.1): 99.0, ("refiner", 0.5): 93.0, ("soteria", 0.5): 98.0,
                ("soteria", 0.9): 96.0})


def test_an_order_between_rows_holds_fails_or_is_inconclusive_by_its_interval():
    lower = _judge({"metric": "psnr", "of": {"defense": "refiner"},
                    "to": {"defense": "soteria"}, "expect": {"<": 0}}, RUNS)
    assert lower["ours"] == pytest.approx(np.mean([10, 11, 12, 11, 10, 12, 8, 9, 8, 9, 8, 9])
                                          - 20.0)
    assert lower["verdict"] == "holds" and lower["ci_high"] < 0 and lower["victims"] == 24
    higher = _judge({"metric": "psnr", "of": {"defense": "refiner"},
                     "to": {"defense": "soteria"}, "expect": {">": 0}}, RUNS)
    assert higher["verdict"] == "fails"
    close = _judge({"metric": "psnr", "of": {"defense": "soteria", "strength": 0.5},
                    "to": {"strength": 0.9}, "expect": {"<": 0}}, RUNS)
    assert close["ours"] == pytest.approx(0.0) and close["verdict"] == "inconclusive"
    ratio = _judge({"metric": "psnr", "of": {"defense": "refiner", "strength": 0.5},
                    "to": {"defense": "soteria"}, "by": "ratio", "expect": {"<": 1}}, RUNS)
    assert ratio["ours"] == pytest.approx(8.5 / 20.0) and ratio["verdict"] == "holds"


def test_best_picks_one_row_per_side_among_those_that_keep_the_bound():
    # above PMM 95 Refiner keeps only 0.1 (11 dB), Soteria both (lowest: 0.9, 20 dB)
    picked = _judge({"metric": "psnr", "of": {"defense": "refiner", "strength": None},
                     "to": {"defense": "soteria"}, "best": "min",
                     "over": {"pmm": {">": 95}}, "expect": {"<": 0}}, RUNS)
    assert picked["ours"] == pytest.approx(11.0 - 20.0) and picked["victims"] == 12
    nothing = _judge({"metric": "psnr", "of": {"defense": "refiner"}, "best": "min",
                      "over": {"pmm": {">": 99.5}}, "expect": {"<": 30}}, RUNS)
    assert np.isnan(nothing["ours"]) and nothing["verdict"] == "inconclusive"


def test_an_fl_metric_counts_each_run_once_and_one_seed_gives_no_interval():
    judged = _judge({"metric": "pmm", "of": {"defense": "soteria"}, "expect": {">": 90}}, RUNS)
    assert judged["ours"] == pytest.approx(97.0) and judged["victims"] == 2
    single = _judge({"metric": "pmm", "of": {"defense": "soteria", "strength": 0.5},
                     "expect": {">": 90}}, RUNS)
    assert single["victims"] == 1 and single["verdict"] == "inconclusive"


def test_an_asr_claim_reads_every_victim_and_a_rate_of_zero_is_not_certain():
    judged = _judge({"metric": "asr", "of": {"defense": "refiner"},
                     "to": {"defense": "soteria"}, "expect": {"<": 0}}, RUNS)
    # every SSIM is PSNR / 40 < 0.9: no success on either side, 0 - 0, not a sure zero
    assert judged["ours"] == 0.0 and judged["ci_low"] < 0 < judged["ci_high"]
    assert judged["verdict"] == "inconclusive"


def test_claims_table_has_the_issue_s_columns_and_its_summary():
    claims = [{"id": "a", "section": "§1", "statement": "s", "paper": 0.5,
               "expect": {"<": 1}}, {"id": "b", "section": "§2", "statement": "t",
                                      "paper": None, "expect": {">": 0}}]
    judged = pd.DataFrame([{"claim": "a", "ours": 0.4, "ci_low": 0.3, "ci_high": 0.6,
                            "verdict": "holds", "victims": 8, "seeds": 1}])
    table = claims_table(claims, [judged], "P", {"a": "paper", "b": "stand-in"}, "smoke")
    assert list(table.columns) == CLAIM_COLUMNS
    assert table["verdict"].tolist() == ["holds", "inconclusive"]
    assert summary_line(table) == "1 holds, 1 inconclusive (of 2)"


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize("paper", sorted(LEAST))
def test_each_paper_states_its_claims_in_its_own_words(paper):
    config = configuration.load(REPO / "config" / "paper" / f"{paper}.yaml")
    smoke = configuration.validate({**cfg.read(REPO / "config" / "paper" / f"{paper}.yaml"),
                                    "scale": "smoke"})
    text = _words((REPO.parent / "shared" / "papers" / f"{paper}.txt").read_text()) \
        if (REPO.parent / "shared" / "papers").is_dir() else None
    assert config["paper"] and len(config["claims"]) >= LEAST[paper]
    assert len(smoke["claims"]) == len(config["claims"])
    for claim in config["claims"]:
        assert len(claim["statement"].split()) <= 30, claim["id"]
        if text is not None:  # the papers' text, where this checkout has it beside
            assert _words(claim["statement"]) in text, claim["id"]


@pytest.mark.parametrize("change, message", [
    ({"target": "fig1"}, "'target' 'fig1' is not a target with a table"),
    ({"metric": "lpips"}, "'metric' 'lpips' is not a metric of table5's table"),
    ({"of": {"round": 1}}, "'of' names 'round'; expected keys of table5's table"),
    ({"expect": {"=": 1}}, "claims"),
])
def test_a_bad_claim_is_refused_naming_it(change, message):
    epafl = cfg.read(REPO / "config" / "paper" / "epafl.yaml")
    claims = [{**epafl["claims"][0], **change}]
    with pytest.raises(cfg.ConfigError, match=re.escape(message)):
        configuration.validate({**epafl, "claims": claims})
    twice = [epafl["claims"][0], epafl["claims"][0]]
    with pytest.raises(cfg.ConfigError, match="the id is used twice"):
        configuration.validate({**epafl, "claims": twice})


def test_a_scale_merges_its_overrides_and_says_what_it_changes():
    raw = cfg.read(REPO / "config" / "paper" / "epafl.yaml")
    full = configuration.validate(raw)
    reduced = configuration.validate({**raw, "scale": "reduced"})
    assert full["attack"]["victims"]["count"] == 100 and plan.scale_conditions(full) == ""
    assert reduced["attack"]["victims"]["count"] == 8
    assert reduced["datasets"]["cifar10"]["stand_in"] == "natural"
    assert plan.scale_conditions(reduced) == (
        "datasets.cifar10.stand_in=natural; datasets.cifar10.max_images=2000; "
        "attack.victims.count=8")
    assert plan.claim_data(reduced)["time-mnist"] == "paper"  # the real MNIST test set
    assert plan.claim_data(reduced)["time-cifar10"] == "stand-in"
    with pytest.raises(cfg.ConfigError, match=re.escape(
            "'smoke' True is now 'scale' (full, reduced or smoke): --config scale=smoke")):
        configuration.validate({**raw, "smoke": True})


def test_the_natural_stand_in_is_photo_crops_in_the_dataset_s_shape():
    data = load("cifar10", stand_in="natural", max_images=300)
    assert tuple(data.x.shape) == (300, 3, 32, 32) and data.num_classes == 10
    assert set(data.y.tolist()) == set(range(10))
    assert float(data.x.std()) > 0.1  # photographs, not a flat fill
    assert tuple(load("mnist", stand_in="natural", max_images=4).x.shape) == (4, 1, 28, 28)


def test_verdicts_are_written_from_claims_files(tmp_path, capsys):
    claims = [{"id": "a", "section": "§1", "statement": "it works", "paper": 0.5,
               "expect": {"<": 1}}]
    judged = pd.DataFrame([{"claim": "a", "ours": 0.4, "ci_low": 0.3, "ci_high": 0.6,
                            "verdict": "holds", "victims": 8, "seeds": 1}])
    table = claims_table(claims, [judged], "EPAFL", {"a": "paper"}, "reduced",
                         "attack.victims.count=8")
    table.to_csv(tmp_path / "claims.csv", index=False)
    assert cli.main(["verdicts", str(tmp_path / "claims.csv")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Verdicts") and "## EPAFL" in text
    assert '| a       | §1        | "it works"' in text and "0.4 [0.3, 0.6]" in text
    assert "changes from the paper's configuration: attack.victims.count=8." in text
    assert "Reading these verdicts" not in text
    (tmp_path / "claims.md").write_text("every attack stays near 9 dB here.\n")
    assert cli.main(["verdicts", str(tmp_path / "claims.csv")]) == 0
    noted = capsys.readouterr().out
    assert noted == text.rstrip("\n") + ("\n\nReading these verdicts: every attack stays near "
                                        "9 dB here.\n")
    (tmp_path / "bad.csv").write_text("claim,ours\na,1\n")
    assert cli.main(["verdicts", str(tmp_path / "bad.csv")]) == 2
    assert "bad.csv: columns ['claim', 'ours'], expected" in capsys.readouterr().err


def test_docs_verdicts_is_what_fedleak_verdicts_writes_from_the_runs_claims(capsys):
    runs = sorted((REPO / "docs" / "verdicts").glob("*.csv"))
    assert runs  # at least one reduced run's claims.csv
    assert cli.main(["verdicts", *map(str, runs)]) == 0
    assert capsys.readouterr().out == (REPO / "docs" / "verdicts.md").read_text()
