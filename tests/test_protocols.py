"""The FL protocol as an axis: `protocols:` runs every point under each protocol,
each judged against its own undefended run (PMM, the matched-utility curves), and the
rankings side by side (`protocol_ranking.csv`); config/protocol.yaml's smoke line
in the manual (docs/papers.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import in_process
import numpy as np
import pandas as pd
import pytest
from conftest import REPO
from project import ENV, copy_project
from test_matched_utility import _json

from gradleak.config import ConfigError, read
from gradleak.experiment import configuration, fl_runs, plan
from gradleak.experiment.phases.aggregate import protocol_names
from gradleak.report import write_figures, write_report, write_tables
from gradleak.report.matched_utility import matched_utility
from gradleak.report.protocol_ranking import protocol_ranking, ranking_summary
from gradleak.settings import Setting

CASE = "digits-lenet-iid-k10"
FEDAVG = "attack.protocol.batch_size=4~fl.local_steps=5"
PAPERS_PAGE = (REPO / "docs" / "papers.md").read_text()


def test_each_point_runs_under_each_protocol_with_its_own_undefended_fl_run():
    config = configuration.load(REPO / "config" / "protocol.yaml")
    settings = {s.text for s in plan.settings(config)}
    assert {"none-0", f"none-0~{FEDAVG}", "soteria-0.6", f"soteria-0.6~{FEDAVG}"} <= settings
    assert len(settings) == 2 * sum(len(d["strengths"]) for d in config["defenses"].values())
    trained = {s.text for _, s in fl_runs.fl_settings(config)}
    assert "none-0~fl.local_steps=5" in trained and "soteria-0.6~fl.local_steps=5" in trained
    assert not any("attack.protocol" in s for s in trained)  # the batch is the attack's
    assert Setting.parse(f"soteria-0.6~{FEDAVG}").reference.text == "none-0~fl.local_steps=5"


def test_the_tables_name_each_protocol_as_the_configuration_does():
    config = configuration.load(REPO / "config" / "protocol.yaml")
    assert protocol_names(config) == {"": "fedsgd", FEDAVG: "fedavg"}


def test_a_protocol_beside_targets_or_with_a_path_that_is_no_protocol_is_refused():
    raw = read(REPO / "config" / "protocol.yaml")
    with pytest.raises(ConfigError, match="'protocols' with 'targets'"):
        configuration.validate({**raw, "targets": read(REPO / "config" / "paper" / "epafl.yaml")
                                ["targets"]})
    with pytest.raises(ConfigError, match=r"fl\.local_step.* is not a path"):
        configuration.validate({**raw, "protocols": {"fedavg": {"fl.local_step": 5}}})
    with pytest.raises(ConfigError, match=r"protocols\.fedavg.*attacks\.dlg\.iterations"):
        configuration.validate({**raw, "protocols": {"fedavg": {"attacks.dlg.iterations": 5}}})
    with pytest.raises(ConfigError, match=r"fl\.local_steps.*minimum"):
        configuration.validate({**raw, "protocols": {"fedavg": {"fl.local_steps": 0}}})


@pytest.fixture
def runs(tmp_path: Path) -> tuple[list[Path], list[Path]]:
    """Two protocols with their own undefended runs (accuracy 0.9 and 0.6): under FedSGD
    Soteria leaks less than DP, under FedAvg DP leaks less than Soteria."""
    fl, attacks = [], []
    for setting, accuracy, psnr in [
            ("none-0", 0.9, 40.0), ("dp_gaussian-0.1", 0.81, 30.0),
            ("soteria-0.5", 0.81, 20.0),
            (f"none-0~{FEDAVG}", 0.6, 30.0), (f"dp_gaussian-0.1~{FEDAVG}", 0.54, 10.0),
            (f"soteria-0.5~{FEDAVG}", 0.54, 25.0)]:
        parsed = Setting.parse(setting)
        keys = {"case": CASE, "setting": setting, "defense": parsed.label,
                "strength": parsed.strength, "seed": 0}
        fl_setting = parsed.without(("attack.",))
        fl.append(_json(tmp_path / "fl" / fl_setting.text / "metrics.json",
                        {**keys, "setting": fl_setting.text, "defense": fl_setting.label,
                         "history": [{"test_loss": 1.0}], "final_accuracy": accuracy}))
        victims = [{"victim": v, "label": 1, "predicted_label": 1, "iterations": 5,
                    "wall_time": 0.1, "stop_reason": "budget", "psnr": psnr + v,
                    "ssim": 0.1, "mse": 0.1} for v in (-0.5, -0.3, -0.1, 0.1, 0.3, 0.5)]
        attacks.append(_json(tmp_path / "attacks" / setting / "metrics.json",
                             {**keys, "runs": {"inverting_gradients": {"victims": victims}}}))
    return fl, attacks


def test_pmm_and_each_protocol_s_curves_start_from_its_own_undefended_run(runs, tmp_path):
    fl, attacks = runs
    tables = write_tables(fl, attacks, [], tmp_path / "tables",
                          ["utility", "tradeoff", "matched_utility", "protocol_ranking"])
    utility = tables["utility"].set_index("defense")["pmm"]
    assert utility["dp_gaussian~fl.local_steps=5"] == pytest.approx(90.0)  # 0.54 / 0.6
    assert utility["dp_gaussian"] == pytest.approx(90.0)  # 0.81 / 0.9
    tradeoff = tables["tradeoff"].set_index("defense")["pmm"]
    assert tradeoff[f"dp_gaussian~{FEDAVG}"] == pytest.approx(90.0)  # its FL run's PMM
    matched = tables["matched_utility"].query("pmm == 95").set_index(["protocol", "defense"])
    assert set(matched.index.get_level_values("protocol")) == {"", FEDAVG}
    # halfway from the protocol's own undefended PSNR to the defense's at PMM 90
    assert matched.loc[("", "soteria"), "psnr"] == pytest.approx(30.0)
    assert matched.loc[(FEDAVG, "dp_gaussian"), "psnr"] == pytest.approx(20.0)
    assert matched.loc[(FEDAVG, "soteria"), "psnr"] == pytest.approx(27.5)
    summary = ranking_summary(tables["protocol_ranking"])
    assert summary[["pmm", "first", "versus_first", "first_kept"]].values.tolist() == [
        [90, "dp_gaussian", "soteria", False], [95, "dp_gaussian", "soteria", False],
        [99, "dp_gaussian", "soteria", False]]  # 6 victims a side: 1 dB apart is no tie
    figures = write_figures(tables, attacks, tmp_path / "figures", ["protocol_ranking"])
    assert figures[0].read_bytes().startswith(b"\x89PNG")
    text = write_report(tables, figures, [], tmp_path / "report.md").read_text()
    assert "## Does the ranking of defenses change with the protocol?" in text
    assert re.search(r"\| inverting_gradients \(paper\) \| +90 \| soteria +\| dp_gaussian +\| "
                     r"\*\*no\*\*", text)
    named = write_tables(fl, attacks, [], tmp_path / "named", ["protocol_ranking"],
                         protocols={FEDAVG: "fedavg", "": "fedsgd"})["protocol_ranking"]
    assert list(dict.fromkeys(named["protocol"])) == ["fedavg", "fedsgd"]  # as given
    assert set(ranking_summary(named)["versus"]) == {"fedavg"}


def test_one_protocol_makes_no_ranking_and_a_tie_keeps_the_best():
    rows = [{"case": CASE, "defense": d, "strength": s, "attack": "idlg", "pmm": p, "psnr": q,
             "ssim": 0.1, "psnr_low": q - 3, "psnr_high": q + 3}
            for d, s, p, q in [("none", 0, 100, 40), ("dp_gaussian", 0.1, 90, 20),
                               ("soteria", 0.5, 90, 22),
                               ("none~fl.local_steps=5", 0, 100, 40),
                               ("dp_gaussian~fl.local_steps=5", 0.1, 90, 24),
                               ("soteria~fl.local_steps=5", 0.5, 90, 21)]]
    matched = matched_utility(pd.DataFrame(rows))
    assert protocol_ranking(matched[matched["protocol"] == ""]).empty
    ranking = protocol_ranking(matched)
    at90 = ranking[ranking["pmm"] == 90].set_index(["protocol", "defense"])
    assert at90["rank"].to_dict() == {("", "dp_gaussian"): 1, ("", "soteria"): 2,
                                      ("fl.local_steps=5", "dp_gaussian"): 2,
                                      ("fl.local_steps=5", "soteria"): 1}
    row = ranking_summary(ranking).query("pmm == 90").iloc[0]
    assert row["first_kept"] and row["first"] == row["versus_first"] == "dp_gaussian, soteria"
    assert np.isnan(row["spearman"])  # two defenses: no rank correlation


def _smoke_line() -> str:
    lines = [line.strip().strip("`") for line in PAPERS_PAGE.splitlines()
             if line.startswith("snakemake") and "config/protocol.yaml" in line
             and "scale=smoke" in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.slow
def test_the_manual_protocol_smoke_run_writes_both_matched_utility_tables_side_by_side(tmp_path):
    """The manual's smoke line for config/protocol.yaml, planned by Snakemake (dry run) and
    run in this process (``in_process``), then its aggregate re-made through Snakemake."""
    root = copy_project(tmp_path / "project")
    line = _smoke_line()
    assert "--config scale=smoke" in line
    dry = subprocess.run(f"{line} -n --quiet rules", shell=True, cwd=root, env=ENV,
                         capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr[-4000:]
    planned = dict(re.findall(r"^(\w+) +(\d+)$", dry.stdout + dry.stderr, flags=re.M))
    results = root / "results"
    config = in_process.resolved(root / "config" / "protocol.yaml", results, scale="smoke")
    ran = in_process.run_plan(config, results)
    assert {**ran, "all": 1, "total": sum(ran.values()) + 1} == {
        rule: int(n) for rule, n in planned.items()}
    (results / "report.md").unlink()
    again = subprocess.run(line.replace("snakemake ", "snakemake results/report.md ", 1),
                           shell=True, cwd=root, env=ENV, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-4000:]
    assert dict(re.findall(r"^(\w+) +(\d+)$", again.stderr.split("Job stats:")[1],
                           flags=re.M)) == {"aggregate": "1", "total": "1"}
    matched = pd.read_csv(results / "tables" / "matched_utility.csv", keep_default_na=False)
    assert set(matched["protocol"]) == {"fedsgd", "fedavg"}  # as config/protocol.yaml names them
    assert set(matched["attacker"]) == {"paper", "adaptive", "strongest"}
    ranking = pd.read_csv(results / "tables" / "protocol_ranking.csv", keep_default_na=False)
    assert list(dict.fromkeys(ranking["protocol"])) == ["fedsgd", "fedavg"]  # FedSGD's first
    utility = pd.read_csv(results / "tables" / "utility.csv").set_index("defense")
    assert utility.loc["none~fl.local_steps=5", "pmm"] == pytest.approx(100.0)
    report = (results / "report.md").read_text()
    assert "## Does the ranking of defenses change with the protocol?" in report
    assert (results / "figures" / "protocol_ranking.png").read_bytes().startswith(b"\x89PNG")
