"""Verdicts (decision 0105): a claim's quantity measured on its target (paired where both
sides read the same victims, a pick made again per resample), judged only in the paper's
regime (each requirement kind: an attack that reconstructs undefended, FL that learns,
victims and seeds a side, the metric measured, fixed settings for a sign test, what the
plan cannot decide), with the paper's magnitude (a bound or a band)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gradleak.report.claims import measure
from gradleak.report.target_data import TargetInputs, build_table, source_of
from gradleak.report.verdicts import (
    CLAIM_COLUMNS,
    claims_table,
    sign_verdict,
    summary_line,
    verdict,
)
from gradleak.utils.keys import Family, same
from gradleak.utils.metric_kinds import FLAT_MARGIN, bar_twin

SPEC = {"rows": ["defense", "strength"], "metrics": ["psnr", "pmm", "asr"]}
REGIME = {"victims": 6, "seeds": 3, "learns": [
    {"id": "fl", "target": "t", "of": {"defense": "none"}, "metric": "accuracy",
     "floor": 0.5, "paper": 0.6, "source": "Table 9"}], "reconstructs": [
    {"id": "ig", "attacks": ["ig"], "target": "t", "of": {"defense": "none"},
     "metric": "psnr", "floor": 18.0, "paper": 24.0, "source": "Table 10"}]}


def _inputs(psnr: dict[tuple, list[float]], pmm: dict[tuple, list[float]]) -> TargetInputs:
    """Victim rows of each (defense, strength) under seed 0 (victims 0..n-1, the same
    images in every setting), and one FL run per seed with its accuracy and PMM."""
    victims = pd.DataFrame([{"case": "c", "defense": d, "strength": s, "series": None,
                             "seed": 0, "attack": "ig", "victim": i, "psnr": p,
                             "ssim": p / 40, "pmm": pmm[(d, s)][0], "dataset": "cifar10"}
                            for (d, s), values in psnr.items() for i, p in enumerate(values)])
    fl = pd.DataFrame([{"case": "c", "defense": d, "strength": s, "series": None, "seed": k,
                        "pmm": v, "accuracy": v / 100 * 0.6, "dataset": "cifar10"}
                       for (d, s), values in pmm.items() for k, v in enumerate(values)])
    return TargetInputs(victims, fl, pd.DataFrame(), pd.DataFrame())


RUNS = _inputs({("none", 0): [22, 24, 23, 25, 21, 24],
                ("refiner", 0.1): [10, 11, 12, 11, 10, 12],
                ("refiner", 0.5): [8, 9, 8, 9, 8, 9],
                ("soteria", 0.5): [20, 21, 19, 20, 21, 19],
                ("soteria", 0.9): [19, 20, 21, 20, 19, 21]},
               {("none", 0): [100, 100, 100], ("refiner", 0.1): [99, 98.5, 99.5],
                ("refiner", 0.5): [93, 94, 92], ("soteria", 0.5): [98, 97, 98.5],
                ("soteria", 0.9): [96, 96.5, 95.5]})


def _measured(claim: dict, inputs: TargetInputs = RUNS, spec: dict = SPEC) -> dict:
    claim = {"id": "c", "target": "t", "by": "difference", **claim}
    return measure(claim, spec, build_table(spec, inputs), source_of(inputs, spec["metrics"]),
                   study=not inputs.study.empty, fl=inputs.fl)


def _judged(claim: dict, inputs: TargetInputs = RUNS, regime: dict = REGIME,
            construction: list[str] = (), spec: dict = SPEC) -> pd.Series:
    claim = {"id": "c", "target": "t", "by": "difference", "section": "§1",
             "statement": "s", "paper": None, **claim}
    measured = [pd.DataFrame([_measured(claim, inputs, spec)])]
    if regime:  # the regime's entries (and their flat bars, where run), on the same target
        twins = [bar_twin(e) for e in regime["reconstructs"]] \
            if "psnr_flat" in inputs.victims else []
        measured.append(pd.DataFrame([_measured(e, inputs, spec) for e in
                                      [*regime["reconstructs"], *regime["learns"], *twins]
                                      if e]))
    studies = {"t"} if not inputs.study.empty else set()
    table, _ = claims_table([claim], measured, regime or {}, {"c": list(construction)},
                            studies, "P", {"c": "stand-in"}, "reduced")
    return table.iloc[0]


def test_an_order_between_rows_is_paired_over_the_same_victims():
    lower = _measured({"metric": "psnr", "of": {"defense": "refiner"},
                       "to": {"defense": "soteria"}})
    assert lower["paired"] and lower["n_of"] == lower["n_to"] == 6  # a victim's rows averaged
    assert lower["ours"] == pytest.approx(np.mean([9, 10, 10, 10, 9, 10.5]) - 20.0)
    assert lower["ci_high"] < 0 and lower["method"] == "bootstrap-t"
    assert lower["rows"] == "defense refiner / defense soteria"
    ratio = _measured({"metric": "psnr", "of": {"defense": "refiner", "strength": 0.5},
                       "to": {"defense": "soteria"}, "by": "ratio"})
    assert ratio["ours"] == pytest.approx(8.5 / 20.0) and ratio["ci_high"] < 1


def test_a_verdict_needs_the_whole_interval_on_one_side_or_in_the_band():
    assert verdict(-3.0, -1.0, {"<": 0}) == "holds" and verdict(1.0, 3.0, {"<": 0}) == "fails"
    assert verdict(-1.0, 1.0, {"<": 0}) == "inconclusive"
    assert verdict(-3.4, -2.2, {"between": [-4.5, -1.5]}) == "holds"
    assert verdict(0.2, 1.0, {"between": [-4.5, -1.5]}) == "fails"
    assert verdict(-2.0, 0.5, {"between": [-4.5, -1.5]}) == "inconclusive"
    assert verdict(np.nan, np.nan, {">": 0}) == "inconclusive"
    assert sign_verdict(5, 5) == "holds" and sign_verdict(0, 6) == "fails"
    assert sign_verdict(3, 5) == "inconclusive"


def test_in_regime_a_claim_holds_or_fails_by_its_interval():
    holds = _judged({"metric": "psnr", "of": {"defense": "refiner"},
                     "to": {"defense": "soteria"}, "expect": {"<": 0}})
    assert holds["verdict"] == "holds" and holds["why"] == ""
    fails = _judged({"metric": "psnr", "of": {"defense": "refiner"},
                     "to": {"defense": "soteria"}, "expect": {"between": [-4.5, -1.5]},
                     "reason": "approximately 3"})
    assert fails["verdict"] == "fails" and fails["expect"] == "in [-4.5, -1.5]"


def test_an_attack_that_does_not_reconstruct_undefended_makes_the_claim_untestable():
    weak = {**REGIME, "reconstructs": [{**REGIME["reconstructs"][0], "floor": 25.0}]}
    judged = _judged({"metric": "psnr", "of": {"defense": "refiner"},
                      "to": {"defense": "soteria"}, "expect": {"<": 0}}, regime=weak)
    assert judged["verdict"] == "untestable"
    assert judged["why"] == "undefended ig psnr 23.2 not >= 25 (Table 10, paper 24)"
    priced = {**REGIME, "reconstructs": [{**REGIME["reconstructs"][0], "floor": 25.0,
                                          "in_regime_at": "9 CPU-hours at the paper's scale"}]}
    judged = _judged({"metric": "psnr", "of": {"defense": "refiner"},
                      "to": {"defense": "soteria"}, "expect": {"<": 0}}, regime=priced)
    assert judged["why"] == ("undefended ig psnr 23.2 not >= 25 (Table 10, paper 24), in regime "
                             "at 9 CPU-hours at the paper's scale")
    bare = _judged({"metric": "psnr", "of": {"defense": "refiner"}, "expect": {"<": 30}},
                   regime={**REGIME, "reconstructs": []})
    assert bare["why"] == "no regime entry says how ig reconstructs undefended"


def test_an_attack_not_clear_of_a_flat_image_of_each_victim_s_colour_does_not_reconstruct():
    """Decision 0111: a mean PSNR in regime is also at least FLAT_MARGIN above the flat
    image in the data's mean colour on the same victims, whatever the floor says."""
    claim = {"metric": "psnr", "of": {"defense": "refiner"}, "to": {"defense": "soteria"},
             "expect": {"<": 0}}

    def with_flat(undefended: float) -> TargetInputs:
        victims = RUNS.victims.assign(psnr_flat=np.where(RUNS.victims["defense"] == "none",
                                                         undefended, 14.0))
        return TargetInputs(victims, RUNS.fl, pd.DataFrame(), pd.DataFrame())

    assert _judged(claim, inputs=with_flat(21.0))["verdict"] == "holds"  # 23.2 >= 22
    judged = _judged(claim, inputs=with_flat(22.8))
    assert judged["verdict"] == "untestable" and FLAT_MARGIN == 1.0
    assert judged["why"] == ("undefended ig psnr 23.2 not >= 18 and >= 23.8 (a flat image "
                             "22.8 + 1) (Table 10, paper 24)")


def test_a_utility_claim_needs_fl_that_learns_and_three_seeds():
    pmm = {"metric": "pmm", "of": {"defense": "soteria"}, "to": {"defense": "refiner"},
           "expect": {">": 0}}
    assert _judged(pmm)["verdict"] in ("holds", "inconclusive")
    weak = {**REGIME, "learns": [{**REGIME["learns"][0], "floor": 0.9}]}
    assert "undefended FL accuracy 0.6 not >= 0.9" in _judged(pmm, regime=weak)["why"]
    one = _inputs({("none", 0): [22] * 6}, {("none", 0): [100], ("soteria", 0.5): [97],
                                             ("refiner", 0.1): [99]})
    judged = _judged({**pmm, "of": {"defense": "soteria"}}, inputs=one)
    assert judged["why"] == "fewer than 2 units; 1 FL seed a side, PMM needs 3"


def test_too_few_victims_or_a_metric_not_measured_or_no_rows_is_untestable():
    few = _judged({"metric": "psnr", "of": {"defense": "refiner"}, "expect": {"<": 30},
                   "requires": {"victims": 16}})
    assert few["why"] == "6 victims a side, the claim needs 16"
    missing = RUNS.victims.assign(psnr=np.where(RUNS.victims["defense"] == "soteria", np.nan,
                                                RUNS.victims["psnr"]))
    unmeasured = _judged({"metric": "psnr", "of": {"defense": "soteria"}, "expect": {"<": 30}},
                         inputs=TargetInputs(missing, RUNS.fl, pd.DataFrame(), pd.DataFrame()))
    assert unmeasured["why"] == "psnr not measured on of (NaN on all 6 units)"
    absent = _judged({"metric": "psnr", "of": {"defense": "dp"}, "expect": {"<": 30}})
    assert absent["why"] == "not run: no row of t with {'defense': 'dp'}"


def test_what_the_plan_cannot_decide_comes_first_in_why():
    judged = _judged({"metric": "psnr", "of": {"defense": "refiner"}, "expect": {"<": 30}},
                     construction=["ig runs 150 of the paper's 4000 iterations"])
    assert judged["verdict"] == "untestable"
    assert judged["why"] == "ig runs 150 of the paper's 4000 iterations"


def test_a_pick_is_made_again_in_each_resample_and_its_rows_named():
    # above PMM 95 Refiner keeps only 0.1 (11 dB); Soteria 0.9 sits at the bound (PMM 96)
    picked = _measured({"metric": "psnr", "of": {"defense": "refiner", "strength": None},
                        "to": {"defense": "soteria"}, "best": "min",
                        "over": {"pmm": {">": 95.8}}})
    assert picked["ours"] == pytest.approx(11.0 - 20.0)
    of, to = picked["rows"].split(" / ")
    assert of == "defense refiner, strength 0.1 (100%)"
    # Soteria's two strengths tie at 20 dB and 0.9 sits near the bound: the pick moves
    assert to.startswith("defense soteria, strength 0.5 (") and "strength 0.9 (" in to
    nothing = _judged({"metric": "psnr", "of": {"defense": "refiner"}, "best": "min",
                       "over": {"pmm": {">": 99.9}}, "expect": {"<": 30}})
    assert nothing["why"].startswith("no row of t keeps pmm > 99.9")


def test_fixed_settings_are_compared_by_a_sign_test_or_untestable():
    spec = {"rows": ["rate", "mode"], "metrics": ["seconds"]}

    def study(rates):
        rows = [{"rate": r, "mode": m, "seconds": r * (1 if m == "weight" else 2)}
                for r in rates for m in ("weight", "grad")]
        return TargetInputs(*(pd.DataFrame() for _ in range(4)), study=pd.DataFrame(rows))

    claim = {"metric": "seconds", "of": {"mode": "weight"}, "to": {"mode": "grad"},
             "expect": {"<": 0}}
    two = _judged(claim, inputs=study([0.2, 0.4]), spec=spec, regime=None)
    assert two["method"] == "sign 2/2" and two["verdict"] == "untestable"
    assert "2 fixed settings: a sign test across them needs 5" in two["why"]
    five = _judged(claim, inputs=study([0.1, 0.3, 0.5, 0.7, 0.9]), spec=spec, regime=None)
    assert five["method"] == "sign 5/5" and five["verdict"] == "holds"


def test_claims_table_has_every_column_and_counts_each_verdict():
    judged = _judged({"metric": "psnr", "of": {"defense": "refiner"}, "expect": {"<": 30}},
                     construction=["smoke scale"])
    assert list(judged.index) == CLAIM_COLUMNS
    table = pd.DataFrame({"verdict": ["holds", "untestable", "untestable", "fails"]})
    assert summary_line(table) == "1 holds, 1 fails, 2 untestable (of 4)"


def _attribute_runs(race: float, age: float) -> TargetInputs:
    """Stru-NN against RecUP-FL and no defense at six rounds, on race and age, 500 test
    uploads a round, chance 0.34; RecUP-FL 0.1 below the undefended ASR."""
    rows = [{"case": "c", "defense": d, "strength": 0 if d == "none" else 0.1, "seed": 0,
             "adversary": "stru_nn", "attribute": a, "round": r, "dataset": "lfw",
             "attribute_asr": base - (d != "none") * 0.1 + 0.002 * r, "chance": 0.34,
             "uploads": 500}
            for d in ("none", "recupfl") for a, base in (("race", race), ("age", age))
            for r in range(6)]
    return TargetInputs(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(),
                        attribute=pd.DataFrame(rows))


def test_an_adversary_is_in_regime_above_chance_by_its_margin_on_its_own_attribute():
    """An attribute entry (S: issue 71) is in regime at its floor and at its ``above_chance``
    over the chance of the same rows, with Wilson's interval of the pooled uploads; a claim
    on age needs the age entry only (``attributes``), whatever race's says."""
    spec = {"rows": ["defense", "adversary", "attribute", "round"],
            "metrics": ["attribute_asr", "chance"]}
    entries = [{"id": a, "attacks": ["stru_nn"], "attributes": [a], "target": "t",
                "of": {"defense": "none", "attribute": a}, "metric": "attribute_asr",
                "floor": 0.4, "above_chance": 0.1, "paper": 0.8, "source": "Fig. 11"}
               for a in ("race", "age")]
    regime = {"victims": 6, "seeds": 1, "learns": [], "reconstructs": entries}
    claim = {"id": "c", "target": "t", "by": "difference", "section": "§6", "statement": "s",
             "paper": None, "metric": "attribute_asr", "expect": {"<": 0},
             "of": {"defense": "recupfl", "attribute": "age"}, "to": {"defense": "none"}}

    def judged(race: float, age: float) -> tuple[pd.Series, pd.DataFrame]:
        inputs = _attribute_runs(race, age)
        table = build_table(spec, inputs)
        on = [claim, *entries, *(bar_twin(e) for e in entries)]
        measured = pd.DataFrame([measure(c, spec, table, source_of(inputs, spec["metrics"]),
                                         fl=inputs.fl) for c in on])
        claims, rows = claims_table([claim], [measured], regime, {}, set(), "P",
                                    {"c": "stand-in"}, "reduced")
        return claims.iloc[0], rows.set_index("entry")

    holds, rows = judged(race=0.30, age=0.60)  # race out of regime, age in
    assert holds["verdict"] == "holds" and rows.loc["race", "in_regime"] == "no"
    age = rows.loc["age"]
    assert age["ours"] == pytest.approx(0.605) and age["bar"] == pytest.approx(0.34)
    assert age["ci_low"] < 0.605 < age["ci_high"] and age["ci_high"] - age["ci_low"] < 0.05
    near, _ = judged(race=0.60, age=0.42)  # above its floor, not 0.1 above chance
    assert near["verdict"] == "untestable"
    assert near["why"] == ("undefended stru_nn attribute_asr 0.425 not >= 0.4 and >= 0.44 "
                           "(chance 0.34 + 0.1) (Fig. 11, paper 0.8)")


def test_a_matched_claim_reads_the_baseline_at_the_defended_run_s_learning_loss():
    """``matched: learning_loss`` (RecUP-FL §6.1): per setting, DP's ASR interpolated on
    its (loss, ASR) curve from the undefended run at RecUP-FL's loss, then compared paired
    by the sign test; a loss beyond DP's curve is not extrapolated."""
    # DP's strengths each with their own clip (`paired:`), one family; Laplace's not in it
    points = {("none", 0): (0.50, 0.0), ("dp_gaussian~clip=0.001", 0.01): (0.52, -0.02),
              ("dp_gaussian~clip=5.6e-05", 0.1): (0.60, -0.05),
              ("dp_laplace~clip=0.001", 0.1): (0.54, -0.30), ("recupfl", 0.1): (0.55, -0.10),
              ("recupfl", 0.5): (0.65, -0.20)}
    frame = pd.DataFrame([{"case": "c", "defense": d, "strength": s, "seed": 0,
                           "adversary": "stru_nn", "attribute": "race", "round": r,
                           "dataset": "lfw", "attribute_asr": 0.6 + 0.01 * r + shift,
                           "chance": 0.34, "learning_loss": loss, "uploads": 500}
                          for (d, s), (loss, shift) in points.items() for r in range(6)])
    inputs = TargetInputs(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(),
                          attribute=frame)
    spec = {"rows": ["defense", "strength", "adversary", "attribute", "round"],
            "metrics": ["attribute_asr", "learning_loss"]}
    claim = {"id": "c", "target": "t", "by": "difference", "metric": "attribute_asr",
             "matched": "learning_loss", "expect": {"<": 0},
             "of": {"defense": "recupfl", "strength": 0.1},
             "to": {"defense": "dp_gaussian~clip=0.001", "strength": 0.01}}
    table = build_table(spec, inputs)
    matched = measure(claim, spec, table, source_of(inputs, spec["metrics"]))
    # DP at loss 0.55: -0.02 + (0.03 / 0.08) * -0.03 below the undefended ASR
    assert matched["ours"] == pytest.approx(-0.10 - (-0.02 - 0.375 * 0.03))
    assert matched["method"] == "sign 6/6" and matched["n_to"] == 6
    plain = measure({**claim, "matched": None} | {"id": "p"}, spec, table,
                    source_of(inputs, spec["metrics"]))
    assert plain["ours"] == pytest.approx(-0.08)  # the fixed pair, at different losses
    beyond = measure({**claim, "of": {"defense": "recupfl", "strength": 0.5}}, spec, table,
                     source_of(inputs, spec["metrics"]))
    assert beyond["n_to"] == 0 and beyond["unmet"] == (
        "learning_loss 0.65 outside the dp_gaussian curve's span 0.5-0.6: no value at the "
        "same loss on any of 6 units")
    # RecUP-FL §6.3's tolerance: DP's points within 0.14 of 0.65 (0.60 and 0.52) count, the
    # lower ASR of the two read (the baseline the claim must beat)
    near = measure({**claim, "of": {"defense": "recupfl", "strength": 0.5},
                    "matched_within": 0.14}, spec, table, source_of(inputs, spec["metrics"]))
    assert near["ours"] == pytest.approx(-0.20 - (-0.05)) and near["n_to"] == 6
    far = measure({**claim, "of": {"defense": "recupfl", "strength": 0.5},
                   "matched_within": 0.01}, spec, table, source_of(inputs, spec["metrics"]))
    assert far["n_to"] == 0 and far["unmet"].startswith("learning_loss 0.65 outside 0.01 of")
    absent = measure({**claim, "of": {"defense": "recupfl", "strength": 0.9}}, spec, table,
                     source_of(inputs, spec["metrics"]))  # a smoke scale plans no such row
    assert absent["n_of"] == absent["n_to"] == 0 and np.isnan(absent["ours"])
    # judged: its losses need FL that learns; one FL seed is no shortfall for a sign test
    entry = {"id": "nn", "attacks": ["stru_nn"], "target": "t", "of": {"defense": "none"},
             "metric": "attribute_asr", "floor": 0.4, "paper": 0.8, "source": "Fig. 11"}
    judged, _ = claims_table(
        [{**claim, "section": "§6", "statement": "s", "paper": None}],
        [pd.DataFrame([matched, measure(entry, spec, table,
                                       source_of(inputs, spec["metrics"]))])],
        {"victims": 16, "seeds": 3, "reconstructs": [entry], "learns": []}, {}, set(), "P",
        {"c": "stand-in"}, "reduced")
    assert judged.iloc[0]["why"] == "no regime entry says how undefended FL learns"


def test_a_defense_family_is_its_labels_whatever_their_paired_parameters():
    dp = Family("dp_gaussian~clip=1e-08")
    assert "dp_gaussian~clip=5.6e-05" in dp and "dp_gaussian" in dp
    assert "dp_laplace~clip=1e-08" not in dp
    assert "dp_gaussian~attack.protocol.round=4~clip=1e-08" not in dp
    later = Family("dp_laplace~attack.protocol.round=4~clip=0.001")
    assert "none~attack.protocol.round=4" in later.undefended("none")
    assert "none" in dp.undefended("none") and same("none", dp.undefended("none"))



def test_a_claim_at_the_same_utility_is_undecided_where_its_sides_fl_runs_are_apart():
    """``same_utility`` (RecUP-FL §6.3): Refiner 0.1 and Soteria 0.5 reach accuracy 0.594
    and 0.587 (mean over 3 FL seeds): the same within 0.01, not within 0.005."""
    claim = {"metric": "psnr", "of": {"defense": "refiner", "strength": 0.1},
             "to": {"defense": "soteria", "strength": 0.5}}
    close = _measured({**claim, "same_utility": {"metric": "accuracy", "within": 0.01}})
    assert close["unmet"] == "" and close["ours"] == pytest.approx(11.0 - 20.0)
    apart = _measured({**claim, "same_utility": {"metric": "accuracy", "within": 0.005}})
    assert apart["unmet"] == ("accuracy 0.594 against 0.587: more than 0.005 apart, not at "
                              "the same utility")
    unmeasured = _measured({**claim, "same_utility": {"metric": "test_loss", "within": 0.01}})
    assert unmeasured["unmet"].startswith("test_loss of the FL runs not measured a side")
