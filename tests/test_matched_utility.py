"""The matched-utility table, report section and heat map (issue 33): each defense's PSNR
interpolated at PMM 90/95/99 % on its strength-ordered curve from the undefended run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from gradleak.experiment import configuration, pipeline
from gradleak.experiment.phases.aggregate import figures, tables
from gradleak.report import write_figures, write_report, write_tables
from gradleak.report.matched_utility import (
    MATCHED_COLUMNS,
    crossing,
    defense_directions,
    markdown_section,
    matched_utility,
)

CASE = "digits-lenet-iid"


def _tradeoff(points: dict[str, list[tuple]], attack: str = "inverting_gradients",
              **extra) -> pd.DataFrame:
    """Trade-off rows: defense -> [(strength, pmm, psnr[, psnr_low, psnr_high]), ...]
    (SSIM = PSNR / 100; no interval: NaN, as from one victim)."""
    rows = [{"case": CASE, "defense": d, "strength": s, "attack": attack, "pmm": p,
             "psnr": q, "ssim": q / 100, "psnr_low": ci[0] if ci else np.nan,
             "psnr_high": ci[1] if ci else np.nan, **extra}
            for d, values in points.items() for s, p, q, *ci in values]
    return pd.DataFrame.from_records(rows)


UNDEFENDED = {"none": [(0.0, 100.0, 40.0)]}


def _row(table: pd.DataFrame, defense: str, pmm: int) -> pd.Series:
    found = table[(table["defense"] == defense) & (table["pmm"] == pmm)]
    assert len(found) == 1
    return found.iloc[0]


def test_a_known_crossing_gives_the_linear_interpolation_on_its_segment():
    table = matched_utility(_tradeoff({**UNDEFENDED, "dp_gaussian": [
        (0.2, 80.0, 10.0), (0.1, 96.0, 30.0)]}))
    assert list(table.columns) == MATCHED_COLUMNS
    assert _row(table, "dp_gaussian", 99)["psnr"] == pytest.approx(37.5)  # none..0.1, t = 1/4
    assert _row(table, "dp_gaussian", 95)["psnr"] == pytest.approx(28.75)  # 0.1..0.2, t = 1/16
    assert _row(table, "dp_gaussian", 90)["ssim"] == pytest.approx(0.225)
    assert _row(table, "dp_gaussian", 99)["strength_interval"] == "none..0.1"
    assert _row(table, "dp_gaussian", 95)["strength_interval"] == "0.1..0.2"
    assert table["reached"].all()


def test_a_pmm_outside_the_curves_range_is_never_reached_and_not_extrapolated():
    table = matched_utility(_tradeoff({**UNDEFENDED, "clipping": [
        (4.0, 99.5, 20.0), (1.0, 103.0, 10.0)], "pruning": [(0.3, 96.0, 5.0)]}))
    clipping = table[table["defense"] == "clipping"]
    assert not clipping["reached"].any() and clipping["psnr"].isna().all()
    assert (clipping["best"] == "no").all() and clipping["strength_interval"].isna().all()
    assert _row(table, "pruning", 99)["reached"] and not _row(table, "pruning", 95)["reached"]


def test_a_non_monotone_curve_is_walked_in_strength_order_to_its_first_crossing():
    # none 100 -> 0.1: 101 -> 0.2: 94 -> 0.3: 97 -> 0.4: 85; sorting by PMM would instead
    # put 95 between 94 (0.2) and 97 (0.3)
    table = matched_utility(_tradeoff({**UNDEFENDED, "dp_laplace": [
        (0.3, 97.0, 8.0), (0.1, 101.0, 36.0), (0.4, 85.0, 4.0), (0.2, 94.0, 22.0)]}))
    row = _row(table, "dp_laplace", 95)
    assert row["strength_interval"] == "0.1..0.2"
    assert row["psnr"] == pytest.approx(36.0 + 6 / 7 * (22.0 - 36.0))
    assert _row(table, "dp_laplace", 90)["strength_interval"] == "0.3..0.4"
    assert crossing(np.array([100.0, 97.0]), 97.0) == (0, 1.0)
    assert crossing(np.array([100.0, 101.0]), 99.0) is None


def test_a_lower_is_stronger_defense_starts_from_its_largest_strength():
    # quantization: fewer bits protect more (the schema's `stronger: lower`)
    table = matched_utility(_tradeoff({**UNDEFENDED, "quantization": [
        (2, 90.0, 6.0), (8, 98.0, 30.0), (4, 96.0, 12.0)]}))
    assert _row(table, "quantization", 99)["strength_interval"] == "none..8"
    assert _row(table, "quantization", 95)["psnr"] == pytest.approx(11.0)  # 4..2, t = 1/6
    config = {"defenses": {"none": {}, "q": {"defense": "quantization"}, "pruning": {}}}
    assert defense_directions(config) == {"none": "higher", "q": "lower", "pruning": "higher"}
    renamed = matched_utility(_tradeoff({**UNDEFENDED, "q": [(2, 90.0, 6.0), (8, 98.0, 30.0)]}),
                              stronger={"q": "lower"})
    assert _row(renamed, "q", 99)["strength_interval"] == "none..8"


def test_best_is_yes_only_when_its_interval_clears_every_other_reached_defense():
    table = matched_utility(_tradeoff({**UNDEFENDED,
                                       "soteria": [(0.5, 90.0, 10.0, 8.0, 12.0)],
                                       "pruning": [(0.5, 90.0, 10.5, 9.0, 12.0)],
                                       "refiner": [(0.1, 90.0, 20.0, 18.0, 22.0)],
                                       "clipping": [(1.0, 102.0, 1.0, 0.5, 1.5)]}))
    at_90 = table[table["pmm"] == 90].set_index("defense")["best"]
    # soteria is the lowest, pruning's interval overlaps it: both tied; refiner's does not
    assert at_90.to_dict() == {"clipping": "no", "pruning": "tied", "refiner": "no",
                               "soteria": "tied"}
    clear = matched_utility(_tradeoff({**UNDEFENDED,
                                       "soteria": [(0.5, 90.0, 10.0, 8.0, 12.0)],
                                       "refiner": [(0.1, 90.0, 20.0, 18.0, 22.0)]}))
    assert clear[clear["pmm"] == 90].set_index("defense")["best"].to_dict() == {
        "refiner": "no", "soteria": "yes"}
    # the interpolated interval: none (40 dB, no interval) .. soteria's point, t = 1/2 at 95
    row = _row(clear, "soteria", 95)
    assert np.isnan(row["psnr_low"]) and row["best"] == "tied"
    unsure = matched_utility(_tradeoff({**UNDEFENDED, "soteria": [(0.5, 90.0, 10.0)],
                                        "refiner": [(0.1, 90.0, 20.0, 18.0, 22.0)]}))
    assert set(unsure.loc[unsure["pmm"] == 90, "best"]) == {"tied"}  # no interval: a tie


def test_rows_without_an_attacker_column_are_the_papers_and_adaptive_rows_start_from_it():
    paper = _tradeoff({**UNDEFENDED, "dp_gaussian": [(0.1, 90.0, 20.0)]})
    assert set(matched_utility(paper)["attacker"]) == {"paper"}
    adaptive = _tradeoff({"dp_gaussian": [(0.1, 90.0, 30.0)]}, attacker="adaptive")
    both = matched_utility(pd.concat([paper.assign(attacker="paper"), adaptive]))
    row = both[(both["attacker"] == "adaptive") & (both["pmm"] == 95)].iloc[0]
    assert row["psnr"] == pytest.approx(35.0)  # from the paper's undefended 40 dB
    assert both.groupby(["attacker", "pmm"])["best"].agg(lambda b: (b == "yes").sum()).eq(1).all()


def _json(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


@pytest.fixture
def runs(tmp_path: Path) -> tuple[list[Path], list[Path]]:
    """Metrics files of an undefended run and two DP settings (PMM 100, 96, 80)."""
    fl, attacks = [], []
    for setting, defense, strength, accuracy, psnr in [
            ("none-0", "none", 0.0, 0.9, 40.0),
            ("dp_gaussian-0.1", "dp_gaussian", 0.1, 0.864, 30.0),
            ("dp_gaussian-0.2", "dp_gaussian", 0.2, 0.72, 10.0)]:
        keys = {"case": CASE, "setting": setting, "defense": defense, "strength": strength,
                "seed": 0}
        fl.append(_json(tmp_path / "fl" / setting / "metrics.json",
                        {**keys, "history": [{"test_loss": 1.0}], "final_accuracy": accuracy}))
        victim = {"victim": 0, "label": 1, "predicted_label": 1, "iterations": 5,
                  "wall_time": 0.1, "stop_reason": "budget", "psnr": psnr, "ssim": psnr / 100,
                  "mse": 0.1}
        attacks.append(_json(tmp_path / "attacks" / setting / "metrics.json",
                             {**keys, "runs": {"idlg": {"victims": [victim]}}}))
    return fl, attacks


def test_the_table_figure_and_report_section_come_out_of_aggregate_s_writers(runs, tmp_path):
    fl, attacks = runs
    tables = write_tables(fl, attacks, [], tmp_path / "tables",
                          ["utility", "tradeoff", "matched_utility"])
    csv = pd.read_csv(tmp_path / "tables" / "matched_utility.csv")
    assert list(csv.columns) == MATCHED_COLUMNS
    assert csv["pmm"].tolist() == [90, 95, 99] and (csv["best"] == "yes").all()
    assert csv["psnr"].tolist() == pytest.approx([22.5, 28.75, 37.5])
    figures = write_figures(tables, attacks, tmp_path / "figures", ["matched_utility"])
    assert figures[0].name == "matched_utility.png"
    assert figures[0].read_bytes().startswith(b"\x89PNG")
    text = write_report(tables, figures, [], tmp_path / "report.md",
                        substitutions=["digits stand in for CIFAR-10"]).read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## Stand-ins", "## Privacy at matched utility",
                            "## PMM and mean PSNR per defense setting"]
    assert "| dp_gaussian | **22.5**   | **28.8**   | **37.5**   |" in text


@pytest.mark.slow
def test_the_embedded_default_plans_the_table_and_figure_and_a_paper_config_does_not():
    default = configuration.load(REPO / "config" / "config.yaml")
    jobs = pipeline.walk(default, REPO / "results")
    assert "matched_utility" in tables(default, jobs)
    assert "matched_utility" in figures(default, jobs)
    paper = configuration.load(REPO / "config" / "paper" / "refiner.yaml")
    assert "matched_utility" not in tables(paper, pipeline.walk(paper, REPO / "results"))


def test_the_strongest_attacker_takes_each_defense_s_highest_reached_psnr():
    paper = _tradeoff({**UNDEFENDED, "pruning": [(0.5, 90.0, 10.0, 9.0, 11.0)],
                       "soteria": [(0.5, 90.0, 12.0, 11.0, 13.0)]}, attacker="paper")
    adaptive = _tradeoff({"pruning": [(0.5, 90.0, 30.0, 28.0, 32.0)],
                          "soteria": [(0.5, 90.0, 11.0, 10.0, 12.0)]}, attacker="adaptive")
    other = _tradeoff({"none": [(0.0, 100.0, 40.0, 39.0, 41.0)],
                       "pruning": [(0.5, 90.0, 5.0, 4.0, 6.0)],
                       "soteria": [(0.5, 80.0, 50.0, 49.0, 51.0)]}, attack="dlg",
                      attacker="paper")
    table = matched_utility(pd.concat([paper, adaptive, other]))
    worst = table[table["attacker"] == "strongest"].set_index(["defense", "pmm"])
    assert set(table.loc[table["attacker"] == "strongest", "attack"]) == {"any"}
    assert worst.loc[("pruning", 90), "reached_by"] == "inverting_gradients (adaptive)"
    assert worst.loc[("pruning", 90), ["psnr", "psnr_low", "psnr_high"]].tolist() == [30, 28, 32]
    # dlg's 50 dB through soteria is at PMM 80: at 90 dlg is on none..0.5, 40 -> 50 dB
    assert worst.loc[("soteria", 90), "reached_by"] == "dlg (paper)"
    assert worst.loc[("soteria", 90), "psnr"] == pytest.approx(45.0)
    # judged on the worst case: pruning 30 [28, 32] clear of soteria's 45 [44, 46]
    assert worst.loc[("pruning", 90), "best"] == "yes"
    assert worst.loc[("soteria", 90), "best"] == "no"
    assert table[table["attacker"] != "strongest"]["reached_by"].isna().all()
    text = "\n".join(markdown_section(table))
    assert text.index("the strongest attacker") < text.index("**dlg**, paper attacker")
    assert "inverting_gradients (adaptive)" in text
    alone = matched_utility(paper)  # one attack and attacker: no worst case to take
    assert set(alone["attacker"]) == {"paper"}
