"""RecUP-FL's attribute tables: rows from the jobs' metrics files, the matched-loss gap, the
figure, and the plan's attribute jobs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gradleak import config as cfg
from gradleak.experiment import configuration, fl_runs, plan
from gradleak.report.attribute import attribute_gap, attribute_table, attribute_tradeoff
from gradleak.report.figures import save_figure
from gradleak.settings import Setting

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
    config = configuration.load("config/test.yaml")
    jobs = plan.attribute_jobs(config)
    assert {s.defense for _, s in jobs} == set(config["attribute"]["defenses"])
    assert (jobs[0][0], plan.NONE) in fl_runs.fl_settings(config)
    assert set(config["attribute"]["rounds"]) <= set(plan.checkpoint_rounds(config))
    assert plan.attributes(config, jobs[0][0]) == ["ink", "slant", "stroke"]
    no_adversaries = configuration.validate({**cfg.read("config/test.yaml"),
                                   "attribute": {"adversaries": []}})
    assert plan.attribute_jobs(no_adversaries) == []


def test_every_setting_shares_the_round_zero_adversaries_and_keeps_its_own_later():
    raw = cfg.read("config/test.yaml")
    config = configuration.validate({**raw, "attribute": {**raw["attribute"], "rounds": [0, 2]}})
    settings = {s for _, s in plan.attribute_jobs(config)}
    assert len(settings) == 2
    assert {plan.adversary_setting(s, 0) for s in settings} == {plan.NONE}
    assert {plan.adversary_setting(s, 2) for s in settings} == settings
    overridden = Setting("dp_gaussian", 0.01, (("attribute.feature_size", 64),))
    assert plan.adversary_setting(overridden, 0) == overridden
    assert {(s, r) for _, s, r in plan.adversary_jobs(config)} == \
        {(plan.NONE, 0)} | {(s, 2) for s in settings}


def test_attribute_job_refuses_adversaries_fitted_under_another_model(tmp_path):
    import torch

    from gradleak.experiment.phases.attribute import _saved_adversaries
    from gradleak.models import LeNet
    from gradleak.utils.io import ArtifactError, save_torch

    path = save_torch(tmp_path / "round0.pt", {"format": "gradleak.adversaries",
                                                "model": "0" * 64, "fitted": {}})
    with pytest.raises(ArtifactError, match=r"round0\.pt holds adversaries that learnt under "
                                            r"another model"):
        _saved_adversaries(path, LeNet(1, 10, 16))
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ArtifactError, match=r"other\.pt is not a file of fitted adversaries"):
        _saved_adversaries(tmp_path / "other.pt", LeNet(1, 10, 16))
