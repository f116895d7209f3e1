"""Paper targets on RecUP-FL's attribute results: the attribute frame a target gathers from
its attribute jobs, the metrics that read it, `where`, the `attribute` figure, the files the
target rule waits for, and config/paper/recupfl.yaml's plan."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import REPO

from gradleak import config
from gradleak.experiment import configuration, fl_runs, gather, paths, plan
from gradleak.experiment.phases import target
from gradleak.experiment.phases.train_zoo import zoo_attributes
from gradleak.report.target_curves import attribute_figure
from gradleak.report.target_data import TargetInputs, build_table, select_rows
from gradleak.report.targets import FIGURES, write_target
from gradleak.utils.io import write_json

EMPTY = pd.DataFrame()


def attribute_frame() -> pd.DataFrame:
    """Two defenses at two strengths, two adversaries, two attributes, two rounds."""
    rows = []
    curves = (("recupfl", (0.01, 0.1), 0.3), ("dp_gaussian", (0.01, 0.1), 0.6))
    for defense, strengths, base in curves:
        for strength in strengths:
            for adversary in ("stru_nn", "rf"):
                for attribute in ("race", "age"):
                    for round_ in (0, 9):
                        rows.append({"case": "lfw-x", "dataset": "lfw", "defense": defense,
                                     "strength": strength, "series": "", "seed": 0,
                                     "adversary": adversary, "attribute": attribute,
                                     "round": round_, "attribute_asr": base - strength,
                                     "chance": 0.25, "learning_loss": 0.5 + strength,
                                     "accuracy": 0.7})
    return pd.DataFrame(rows)


def inputs_with(frame: pd.DataFrame) -> TargetInputs:
    return TargetInputs(EMPTY, EMPTY, EMPTY, EMPTY, frame)


def test_attribute_metrics_read_the_attribute_frame_with_any_statistic():
    table = build_table({"rows": ["defense", "adversary"],
                         "metrics": ["attribute_asr:min", "learning_loss:max", "chance",
                                     "accuracy"]}, inputs_with(attribute_frame()))
    row = table.set_index(["defense", "adversary"]).loc[("recupfl", "rf")]
    assert row["attribute_asr:min"] == pytest.approx(0.2)
    assert row["learning_loss:max"] == pytest.approx(0.6)
    assert row["chance"] == 0.25 and row["accuracy"] == 0.7  # accuracy: the same frame
    # FL metrics alone still read the FL runs
    fl = pd.DataFrame({"defense": ["a"], "accuracy": [0.9]})
    assert build_table({"rows": ["defense"], "metrics": ["accuracy"]},
                       TargetInputs(EMPTY, fl, EMPTY, EMPTY, attribute_frame()))[
        "accuracy"].tolist() == [0.9]


def test_where_keeps_the_listed_values_in_the_frames_that_have_the_column():
    history = pd.DataFrame({"defense": ["recupfl", "dp_gaussian"], "test_loss": [1.0, 2.0]})
    inputs = TargetInputs(EMPTY, EMPTY, history, EMPTY, attribute_frame())
    kept = select_rows(inputs, {"attribute": ["race"], "round": [9], "strength": [0.1]})
    assert set(kept.attribute["attribute"]) == {"race"} and set(kept.attribute["round"]) == {9}
    assert set(kept.attribute["strength"]) == {0.1} and len(kept.attribute) == 4
    assert kept.history.equals(history)  # no attribute, round or strength column: untouched
    assert select_rows(inputs, None) is inputs


def test_the_attribute_figure_has_a_row_per_round_a_panel_per_adversary_and_chance():
    assert FIGURES["attribute"] is attribute_figure
    fig = attribute_figure({"kind": "attribute"}, inputs_with(
        attribute_frame().query("attribute == 'race'")), "t")
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in axes) == [
        "rf, round 0", "rf, round 9", "stru_nn, round 0", "stru_nn, round 9"]
    ax = next(ax for ax in axes if ax.get_title() == "rf, round 0")
    curves = {line.get_label(): line for line in ax.get_lines() if line.get_label()[0] != "_"}
    assert set(curves) == {"recupfl", "dp_gaussian"}
    assert list(curves["recupfl"].get_xdata()) == pytest.approx([0.51, 0.6])  # by loss
    assert any(line.get_linestyle() == ":" and list(line.get_ydata()) == [0.25, 0.25]
               for line in ax.get_lines())
    by_attribute = attribute_figure({"kind": "attribute", "panels": "attribute",
                                     "hue": "strength"},
                                    inputs_with(attribute_frame().query("adversary == 'rf'")),
                                    "t")
    assert {ax.get_title() for ax in by_attribute.axes if ax.get_title()} == {
        "age, round 0", "age, round 9", "race, round 0", "race, round 9"}
    empty = attribute_figure({"kind": "attribute"}, inputs_with(EMPTY), "t")
    assert "no attribute results" in empty.axes[0].texts[0].get_text()


def test_write_target_applies_where_to_its_table_and_figure(tmp_path):
    spec = {"title": "t", "select": [{}], "where": {"attribute": ["race"], "round": [0]},
            "table": {"rows": ["defense", "strength", "adversary"],
                      "metrics": ["learning_loss", "attribute_asr"]},
            "figure": {"kind": "attribute"}}
    reference = {"source": "s", "columns": ["defense", "strength", "adversary", "attribute_asr"],
                 "rows": [["recupfl", 0.01, "rf", 0.25]]}
    result = write_target("t", spec, inputs_with(attribute_frame()), reference, tmp_path)
    assert len(result.table) == 8 and {f.name for f in result.files} == {
        "t.csv", "t_vs_paper.csv", "t.png"}
    assert result.comparison["attribute_asr"].tolist() == pytest.approx([0.29])


def small_config() -> dict:
    return configuration.validate({
        "cases": [{"dataset": "digits_attributes", "model": "lenet",
                   "partition": {"kind": "iid", "clients": 4}}],
        "fl": {"seeds": [0], "rounds": 2},
        "defenses": {"none": {"strengths": [0]}, "dp_gaussian": {"strengths": [0.01, 0.1]},
                     "pruning": {"strengths": [0.5]}},
        "attribute": {"adversaries": ["stru_nn", "rf"], "attributes": ["ink"],
                      "defenses": ["dp_gaussian"], "rounds": [0, 1]},
        "targets": {
            "t": {"title": "t", "select": [{"defenses": ["dp_gaussian", "pruning"], "attacks": [],
                                            "sweep": {"fl.participation": [0.5]}}],
                  "where": {"round": [1]},
                  "table": {"rows": ["defense", "strength", "adversary", "participation"],
                            "metrics": ["attribute_asr", "chance", "learning_loss"]},
                  "figure": {"kind": "attribute"}}}})


def write_runs(cfg: dict, results) -> None:
    """An FL metrics file per planned FL run; an attribute metrics file per attribute job."""
    for case, setting in fl_runs.fl_settings(cfg):
        write_json(paths.fl_metrics(results, case, setting, 0), {
            "case": case, "setting": setting.text, "defense": setting.label,
            "strength": setting.strength, "seed": 0, "final_accuracy": 0.8,
            "history": [{"round": 0, "accuracy": 0.1, "test_loss": 2.0},
                        {"round": 2, "accuracy": 0.8, "test_loss": 0.5 + setting.strength}]})
    for case, setting in plan.attribute_jobs(cfg):
        rows = [{"adversary": a, "attribute": "ink", "round": r, "asr": 0.9 - setting.strength,
                 "chance": 0.34, "uploads": 20} for a in ("stru_nn", "rf") for r in (0, 1)]
        write_json(paths.attribute_metrics(results, case, setting, 0), {
            "case": case, "setting": setting.text, "defense": setting.label,
            "strength": setting.strength, "seed": 0, "rows": rows,
            "learning_loss": 0.5 + setting.strength, "accuracy": 0.8})


def test_a_target_gathers_the_attribute_jobs_of_its_points_and_waits_for_them(tmp_path):
    cfg = small_config()
    jobs = plan.attribute_jobs(cfg)
    assert {s.text for _, s in jobs} == {"dp_gaussian-0.01~fl.participation=0.5",
                                         "dp_gaussian-0.1~fl.participation=0.5"}
    files = target.target_files(cfg, tmp_path, "t")
    assert {paths.attribute_metrics(tmp_path, c, s, 0) for c, s in jobs} <= set(files)
    assert not any("pruning" in str(f) for f in files if "attribute" in f.parts)
    write_runs(cfg, tmp_path)
    inputs = gather.target_inputs(cfg, tmp_path, "t")
    frame = inputs.attribute  # pruning has no attribute job: no rows
    # the defense column is the setting's label, with its overrides
    assert len(frame) == 2 * 2 * 2 and set(frame["defense"]) == {
        "dp_gaussian~fl.participation=0.5"}
    assert {"case", "dataset", "series", "seed", "fl.participation", "participation",
            "adversary", "attribute", "round", "attribute_asr", "chance", "learning_loss",
            "accuracy"} <= set(frame.columns)
    assert frame["participation"].unique().tolist() == [0.5]
    target.write_target(cfg, tmp_path, "t")
    table = pd.read_csv(paths.target_dir(tmp_path, "t") / "t.csv")
    assert len(table) == 4  # 2 strengths x 2 adversaries at round 1 (where)
    assert table.set_index(["strength", "adversary"]).loc[(0.1, "rf"), "attribute_asr"] == \
        pytest.approx(0.8)
    assert (paths.target_dir(tmp_path, "t") / "t.png").is_file()


@pytest.mark.parametrize("target, key", [
    ({"where": {"adversaries": ["rf"]}}, "'adversaries' is not a column"),
    ({"figure": {"kind": "attribute", "y": "attribute_asr:best"}}, "attribute_asr:best"),
    ({"figure": {"kind": "attributes"}}, "attributes"),
])
def test_bad_attribute_targets_name_the_key(target, key):
    with pytest.raises(config.ConfigError, match=key):
        configuration.validate(
            {"targets": {"t": {"title": "t", "select": [{"attacks": []}], **target}}})


def test_the_recupfl_paper_config_plans_attribute_jobs_only_where_targets_read_them():
    paper = configuration.load(REPO / "config" / "paper" / "recupfl.yaml")
    attributed = set(plan.attribute_jobs(paper))
    by_target = {}
    for point in plan.points(paper):
        read = (point.case, plan.fl_setting(point.setting)) in attributed
        by_target.setdefault(point.target, set()).add(read)
    for name in ("fig2", "fig3", "fig4", "fig5", "fig8", "fig9", "fig10", "fig11"):
        assert by_target[name] == {True}, name  # every point has its attribute job
        assert paper["targets"][name]["figure"]["kind"] == "attribute"
    # FL only (convergence): only its no-defense run is attacked (none, Fig. 11's baseline,
    # is a listed label), not RecUP-FL's
    fig7 = {(p.case, plan.fl_setting(p.setting)) for p in plan.points(paper)
            if p.target == "fig7"}
    assert {s.defense for _, s in fig7 & attributed} == {"none"}
    assert any(s.defense != "none" for _, s in fig7)
    cases = {plan.find_case(paper, c)["dataset"]: plan.attributes(paper, c)
             for c in plan.attribute_cases(paper)}
    assert cases["audiomnist"][0] == "identity" and cases["adult"] == ["race"]
    assert cases["lfw"] == ["race", "age", "gender", "glasses", "hair"]
    assert 49 in plan.checkpoint_rounds(paper) and paper["fl"]["rounds"] >= 50
    smoke = configuration.validate({**config.read(REPO / "config" / "paper" / "recupfl.yaml"),
                             "scale": "smoke"})
    assert {paper_case["dataset"] for paper_case in smoke["cases"]} == {
        "audiomnist", "adult", "lfw", "celeba"}
    assert all(smoke["datasets"][d]["stand_in"] == "digits"
               for d in ("audiomnist", "adult", "lfw", "celeba"))
    assert len(fl_runs.fl_settings(smoke)) <= 25 and len(plan.attribute_jobs(smoke)) <= 16
    for cfg in (paper, smoke):  # RecUP-FL protects attributes its case's zoo has
        for case, setting in fl_runs.fl_settings(cfg):
            name, params = plan.defense_of(cfg, setting)
            if name == "recupfl":
                assert set(params["attributes"]) <= set(plan.attributes(cfg, case)), setting


def test_the_zoo_learns_the_attributes_a_recupfl_setting_protects():
    """``plan.zoo_attributes``: the attributes of the planned RecUP-FL settings, every one
    of the case's where a setting protects them all (attributes: null)."""
    default = configuration.load(REPO / "config" / "config.yaml")
    (case,) = plan.attribute_cases(default)
    assert plan.attributes(default, case) == ["ink", "slant"]
    assert zoo_attributes(default, case) == ["ink"]  # recupfl protects ink only
    default["defenses"]["recupfl"]["params"]["attributes"] = None
    assert zoo_attributes(default, case) == ["ink", "slant"]
    paper = configuration.load(REPO / "config" / "paper" / "recupfl.yaml")
    lfw = next(c for c in plan.attribute_cases(paper) if c.startswith("lfw"))
    assert set(zoo_attributes(paper, lfw)) >= {"race", "age", "gender"}
