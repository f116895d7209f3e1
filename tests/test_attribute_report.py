"""RecUP-FL's attribute tables: rows from the jobs' metrics files, the matched-loss gap, the
figure, and the plan's attribute jobs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedleak import config as cfg
from fedleak.experiment import plan
from fedleak.report.attribute import attribute_gap, attribute_table, attribute_tradeoff
from fedleak.report.figures import save_figure

CURVES = {  # defense -> [(strength, learning loss, ASR)]
    "none": [(0, 1.0, 0.70)],
    "recupfl": [(0.001, 1.05, 0.30), (0.01, 1.20, 0.20), (0.1, 2.0, 0.1)],
    "dp_gaussian": [(0.01, 1.10, 0.65), (0.1, 1.50, 0.40)],
    "soteria": [(0.3, 1.02, 0.69), (0.9, 1.10, 0.50)],
}


def _write_jobs(folder) -> list:
    files = []
    for defense, points in CURVES.items():
        for strength, loss, asr in points:
            path = folder / f"{defense}-{strength}.json"
            path.write_text(json.dumps({
                "case": "c", "setting": f"{defense}-{strength}", "defense": defense,
                "strength": strength, "seed": 0, "learning_loss": loss, "accuracy": 0.9,
                "rows": [{"adversary": "stru_nn", "attribute": "ink", "round": 0, "asr": asr,
                          "chance": 0.34, "uploads": 100}]}))
            files.append(path)
    return files


def test_attribute_table_has_one_row_per_job_adversary_attribute_and_round(tmp_path):
    table = attribute_table(_write_jobs(tmp_path))
    assert len(table) == sum(len(p) for p in CURVES.values())
    assert {"defense", "strength", "adversary", "attribute", "round", "asr",
            "learning_loss"} <= set(table.columns)
    assert table["defense"].is_monotonic_increasing


def test_gap_interpolates_each_baseline_from_the_undefended_point(tmp_path):
    gap = attribute_gap(attribute_table(_write_jobs(tmp_path))).set_index("strength")
    # at loss 1.05: dp_gaussian's curve none(1.0, .70) -> (1.10, .65) gives .675;
    # soteria's (1.02, .69) -> (1.10, .50) gives .61875, the lowest: RecUP-FL .30 is .31875 below
    assert gap.loc[0.001, "baseline"] == "soteria"
    assert gap.loc[0.001, "gap"] == pytest.approx(0.30 - 0.61875)
    # at loss 1.20 only dp_gaussian's curve reaches: .65 + (.40 - .65) * .1 / .4
    assert gap.loc[0.01, "baseline"] == "dp_gaussian"
    assert gap.loc[0.01, "baseline_asr"] == pytest.approx(0.5875)
    # beyond every baseline's range there is nothing to compare with
    assert np.isnan(gap.loc[0.1, "gap"]) and pd.isna(gap.loc[0.1, "baseline"])


def test_tradeoff_figure_draws_every_defense(tmp_path):
    fig = attribute_tradeoff(attribute_table(_write_jobs(tmp_path)))
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert sorted(labels) == sorted(CURVES)
    assert save_figure(fig, tmp_path / "attribute_tradeoff.png").stat().st_size > 0


def test_plan_runs_attribute_jobs_for_the_named_defenses_and_the_undefended_zoo_run():
    config = cfg.load("config/test.yaml")
    jobs = plan.attribute_jobs(config)
    assert {s.defense for _, s in jobs} == set(config["attribute"]["defenses"])
    assert (jobs[0][0], plan.NONE) in plan.fl_jobs(config)
    assert set(config["attribute"]["rounds"]) <= set(plan.checkpoint_rounds(config))
    assert plan.attributes(config, jobs[0][0]) == ["ink", "slant", "stroke"]
    no_adversaries = cfg.validate({**cfg.read("config/test.yaml"),
                                   "attribute": {"adversaries": []}})
    assert plan.attribute_jobs(no_adversaries) == []
