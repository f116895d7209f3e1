"""Defense-aware attribute adversaries (issue 33, ``attribute.adaptive``): the option
validates, the attribute job writes a ``paper`` and an ``adaptive`` row per adversary,
the adaptive adversary learns from the defended uploads (DP-Gaussian that takes the paper's
adversary to chance leaves it far above), the undefended run's adaptive rows are the
paper's, the tables and figure carry both attackers, and the rows are deterministic."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from gradleak import config as cfg
from gradleak.experiment import configuration, paths, plan
from gradleak.experiment.phases.attribute import run_attribute
from gradleak.experiment.phases.fit_adversaries import fit_adversaries
from gradleak.experiment.phases.fl_run import run_fl
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.report.attribute import (
    attribute_gap,
    attribute_table,
    attribute_tradeoff,
    write_attribute_tables,
)
from gradleak.report.figures import save_figure
from gradleak.settings import Setting
from gradleak.utils.io import read_json

REPO = Path(__file__).resolve().parents[1]
DP = Setting("dp_gaussian", 0.001)


def small_config(adaptive: bool = True) -> dict:
    """The embedded default's digits case, attribute track and DP-Gaussian (clip 4), cut to
    two FL rounds, the undefended run and sigma 1e-3, Stru-NN and RF, the ink attribute."""
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["fl"]["rounds"] = 2
    raw["defenses"] = {"none": {"strengths": [0]},
                       "dp_gaussian": {"strengths": [DP.strength], "params": {"clip": 4.0}}}
    raw["attribute"].update(adversaries=["stru_nn", "rf"], attributes=["ink"], defenses=None,
                            adaptive=adaptive)
    return configuration.validate(raw)


def run_jobs(config: dict, results: Path) -> list[Path]:
    """Data, FL runs, the paper's saved adversaries and every attribute job: their files."""
    prepare_data(config, results, "digits")
    case = plan.case_names(config)[0]
    jobs = plan.attribute_jobs(config)
    for _, setting in jobs:
        run_fl(config, results, case, setting, 0)
    fit_adversaries(config, results, case, plan.NONE, 0, 0)
    for _, setting in jobs:
        run_attribute(config, results, case, setting, 0)
    return [paths.attribute_metrics(results, case, s, 0) for _, s in jobs]


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> list[Path]:
    return run_jobs(small_config(), tmp_path_factory.mktemp("adaptive") / "results")


def test_the_option_is_a_boolean_off_by_default_and_on_in_the_embedded_default():
    raw = cfg.read(REPO / "config" / "test.yaml")
    assert configuration.validate(raw)["attribute"]["adaptive"] is False
    assert configuration.load(REPO / "config" / "config.yaml")["attribute"]["adaptive"] is True
    with pytest.raises(cfg.ConfigError, match=r"'attribute\.adaptive': 'yes' is not of type "
                                              r"'boolean'"):
        configuration.validate({**raw, "attribute": {**raw["attribute"], "adaptive": "yes"}})


@pytest.mark.slow
def test_each_adversary_has_a_paper_and_an_adaptive_row(ran):
    table = attribute_table(ran)
    assert set(table["attacker"]) == {"paper", "adaptive"}
    counts = table.groupby(["defense", "adversary", "attacker"]).size()
    assert (counts == 1).all() and len(counts) == 2 * 2 * 2
    # the undefended uploads are the clean gradients the paper's adversary learns from:
    # its adaptive rows are the paper's, not fitted again
    none = table[table["defense"] == "none"].pivot(index="adversary", columns="attacker",
                                                   values="asr")
    assert (none["adaptive"] == none["paper"]).all()


def test_the_adaptive_adversary_learns_from_the_defended_uploads(ran):
    """Measured: DP-Gaussian sigma 1e-3 takes Stru-NN's ink ASR to chance (paper 0.33, RF
    0.37; chance 0.36) while the adversaries that learnt from DP's uploads reach 0.67 and
    0.61 (undefended 0.68 and 0.57)."""
    table = attribute_table(ran)
    dp = table[table["defense"] == "dp_gaussian"].set_index(["adversary", "attacker"])
    chance = float(dp["chance"].iloc[0])
    for adversary, margin in (("stru_nn", 0.2), ("rf", 0.1)):
        paper, adaptive = dp.loc[(adversary, "paper"), "asr"], dp.loc[(adversary, "adaptive"),
                                                                      "asr"]
        assert paper < chance + 0.05, (adversary, paper, chance)
        assert adaptive > max(paper, chance) + margin, (adversary, paper, adaptive, chance)
    assert read_json(ran[0])["public_defense_time_mean"] > 0  # the DP job's public uploads


def test_gap_and_figure_are_per_attacker(ran, tmp_path):
    table = attribute_table(ran)
    recupfl = table[table["defense"] == "dp_gaussian"].assign(defense="recupfl")
    baseline = table.assign(defense=table["defense"].replace("dp_gaussian", "dp_laplace"))
    gap = attribute_gap(pd.concat([baseline, recupfl], ignore_index=True))
    assert set(gap["attacker"]) == {"paper", "adaptive"}
    # the same ASRs on both sides under each attacker: a gap of zero, never a cross-attacker one
    assert np.allclose(gap["gap"], 0.0)
    fig = attribute_tradeoff(table)
    lines = fig.axes[0].get_lines()
    dashed = [line for line in lines if line.get_linestyle() == "--"]
    assert len(dashed) == 2 and {line.get_color() for line in dashed} == \
        {line.get_color() for line in lines if line.get_linestyle() == "-"}
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "adaptive adversary (defended uploads)" in legend and "dp_gaussian" in legend
    assert save_figure(fig, tmp_path / "attribute_tradeoff.png").stat().st_size > 0


def _copy(ran: list[Path], folder: Path) -> Path:
    """A copy of the fixture's results folder (its data, FL runs and saved adversaries)."""
    return Path(shutil.copytree(ran[0].parents[4], folder / "results"))


def test_without_the_option_the_paper_rows_are_the_same_alone(ran, tmp_path):
    config, results = small_config(adaptive=False), _copy(ran, tmp_path)
    case = plan.case_names(config)[0]
    run_attribute(config, results, case, DP, 0)
    off = read_json(paths.attribute_metrics(results, case, DP, 0))["rows"]
    assert {r["attacker"] for r in off} == {"paper"}
    assert off == [r for r in read_json(ran[0])["rows"] if r["attacker"] == "paper"]


@pytest.mark.slow
def test_same_config_and_seed_give_the_same_tables(ran, tmp_path):
    config, results = small_config(), _copy(ran, tmp_path)
    shutil.rmtree(results / "attribute")  # every metrics file written again
    case = plan.case_names(config)[0]
    for _, setting in plan.attribute_jobs(config):
        run_attribute(config, results, case, setting, 0)
    again = [results / path.relative_to(ran[0].parents[4]) for path in ran]
    first = write_attribute_tables(ran, tmp_path / "first")
    write_attribute_tables(again, tmp_path / "second")
    for name in first:
        assert (tmp_path / "first" / f"{name}.csv").read_bytes() == \
            (tmp_path / "second" / f"{name}.csv").read_bytes()
