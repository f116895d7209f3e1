"""Targets: what a selection plans, how a target's table aggregates victims, how it is
compared with the paper's numbers, and snapshots of an attack's iterations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO
from conftest import lenet_victims as victims

from gradleak import attacks, config, defenses
from gradleak.experiment import configuration, fl_runs, plan
from gradleak.report.markdown import beside
from gradleak.report.reference import compare
from gradleak.report.target_data import TargetInputs, build_table
from gradleak.settings import Setting

EPAFL = configuration.load(REPO / "config" / "paper" / "epafl.yaml")


def test_a_sweep_makes_one_setting_per_value_and_shares_repeated_work():
    table3 = [p for p in plan.points(EPAFL) if p.target == "table3"]
    assert len(table3) == 12 and {p.attacks for p in table3} == {("hybrid",)}
    # the configured hybrid stopper is T 1e-5, P 15: that cell is the undefended main setting
    cell = next(p for p in table3 if dict(p.swept) == {
        "attacks.hybrid.stopper.patience": 15, "attacks.hybrid.stopper.threshold": 1e-5})
    assert cell.setting == Setting("none", 0)
    jobs = plan.jobs(EPAFL)
    assert jobs[cell.case, cell.setting] == ("dlg", "hybrid", "idlg", "plateau", "threshold")
    assert len(jobs) == 34 and len(fl_runs.fl_settings(EPAFL)) == 2  # sweeps of attacks share FL


def test_a_defense_parameter_sweep_is_a_short_override():
    refiner = configuration.load(REPO / "config" / "paper" / "refiner.yaml")
    table6 = [p.setting.text for p in plan.points(refiner) if p.target == "table6"]
    assert table6 == ["refiner-0.1~beta=0.001", "refiner-0.1~beta=0.01", "refiner-0.1~beta=0.1",
                      "refiner-0.1", "refiner-0.1~beta=10.0", "refiner-0.1~beta=100.0",
                      "refiner-0.1~beta=1000.0"]


def test_a_selection_picks_cases_by_model_and_dataset():
    """GIAS: the R-GAP figures select the CNN6/CNN10 cases, Table 1 the ResNet one of the same
    dataset; one FL run per case, shared by the targets that select it."""
    cases = [{"dataset": "digits", "model": m} for m in ("resnet10", "cnn6", "cnn10")]
    built = configuration.validate({
        "cases": cases, "attacks": {"rgap": {}, "dlg": {}},
        "targets": {
            "table1": {"title": "t", "select": [{"attacks": ["dlg"], "models": ["resnet10"]}],
                       "table": {"rows": ["attack"], "metrics": ["psnr"]}},
            "figa2": {"title": "t", "select": [{"attacks": ["rgap"], "datasets": ["digits"],
                                                "models": ["cnn6", "cnn10"]}],
                      "figure": {"kind": "layers", "hue": "attack", "panels": "model"}},
            "figa1": {"title": "t", "select": [{"attacks": ["rgap"], "models": ["cnn6"]},
                                               {"attacks": ["rgap"], "models": ["lenet"]}],
                      "figure": {"kind": "layers"}}}})
    selected = {name: sorted(p.case for p in plan.points(built) if p.target == name)
                for name in built["targets"]}
    assert selected == {"table1": ["digits-resnet10-iid-k10"],
                        "figa2": ["digits-cnn10-iid-k10", "digits-cnn6-iid-k10"],
                        "figa1": ["digits-cnn6-iid-k10"]}  # lenet: no case, nothing
    jobs = plan.jobs(built)
    assert jobs["digits-cnn6-iid-k10", Setting("none", 0)] == ("rgap",)
    assert jobs["digits-resnet10-iid-k10", Setting("none", 0)] == ("dlg",)


@pytest.mark.parametrize("select, key", [
    ({"attacks": ["idgl"]}, "targets.t.select[0].attacks"),
    ({"models": ["cnn7"]}, "targets.t.select[0].models': 'cnn7'"),
    ({"sweep": {"datasets.digits.size": [8]}}, "cannot be swept"),
    ({"sweep": {"attacks.dlg.stopper.threshold": [1e-3]}}, "is not a path"),
    ({"sweep": {"attacks.dlg.iterations": [0]}}, "attacks.dlg.iterations"),
    ({"sweep": {"fl.rounds": ["x"]}}, "fl.rounds"),
])
def test_bad_selections_name_the_key(select, key):
    with pytest.raises(config.ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        configuration.validate({"attacks": {"dlg": {}}, "targets": {
            "t": {"title": "t", "select": [select], "table": {"rows": ["case"],
                                                               "metrics": ["psnr"]}}}})


def test_a_table_row_key_must_be_a_column_and_a_metric_a_known_one():
    base = {"attacks": {"dlg": {}}}
    with pytest.raises(config.ConfigError, match="'threshold' is not a column"):
        configuration.validate({**base, "targets": {"t": {"title": "t", "select": [{}], "table": {
            "rows": ["threshold"], "metrics": ["psnr"]}}}})
    with pytest.raises(config.ConfigError, match="psnr:best"):
        configuration.validate({**base, "targets": {"t": {"title": "t", "select": [{}], "table": {
            "rows": ["case"], "metrics": ["psnr:best"]}}}})


def victims_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "dataset": ["mnist"] * 4 + ["cifar10"] * 2, "series": ["A", "A", "B", "B", "A", "B"],
        "ssim": [0.95, 0.9, 0.2, 0.99, 0.91, 0.5], "iterations": [10, 20, 5, 5, 40, 60],
        "wall_time": [1.0, 2.0, 0.5, 0.5, 3.0, 4.0]})


def test_table_statistics_follow_epafl():
    inputs = TargetInputs(victims_frame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    table = build_table({"rows": ["dataset", "series"], "metrics": [
        "asr", "iterations:sd", "iterations:max", "wall_time:sum"]}, inputs)
    mnist_a = table[(table["dataset"] == "mnist") & (table["series"] == "A")].iloc[0]
    assert mnist_a["asr"] == 0.5  # success is SSIM above 0.9: exactly 0.9 fails
    assert mnist_a["iterations:sd"] == 5.0  # population SD of 10 and 20
    assert mnist_a["iterations:max"] == 20 and mnist_a["wall_time:sum"] == 3.0


def test_statistics_over_successes_keep_the_asr_over_every_victim():
    """EPAFL's code writes its tables' MSE, SSIM, time and iterations over the successful
    victims (its `Succ` lines); the ASR is over all of them."""
    inputs = TargetInputs(victims_frame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    spec = {"rows": ["dataset", "series"], "metrics": ["asr", "ssim", "iterations:max"]}
    every = build_table(spec, inputs).set_index(["dataset", "series"])
    successes = build_table({**spec, "over": "successes"}, inputs).set_index(
        ["dataset", "series"])
    assert (successes["asr"] == every["asr"]).all()
    assert every.loc[("mnist", "A"), "iterations:max"] == 20
    assert successes.loc[("mnist", "A"), "iterations:max"] == 10  # SSIM 0.9 is no success
    assert successes.loc[("mnist", "B"), "ssim"] == 0.99
    assert np.isnan(successes.loc[("cifar10", "B"), "ssim"])  # none succeeded
    with pytest.raises(ValueError, match="table.over: successes needs victims"):
        build_table({"rows": ["series"], "metrics": ["accuracy"], "over": "successes"},
                    TargetInputs(victims_frame(), pd.DataFrame({"series": ["A"],
                                                                "accuracy": [0.5]}),
                                 pd.DataFrame(), pd.DataFrame()))


def test_fl_metrics_such_as_the_fallback_rate_come_from_the_fl_runs():
    fl = pd.DataFrame({"series": ["orthogonal", "official", "official"],
                       "accuracy": [0.1, 0.7, 0.8], "fallback_rate": [0.0, 0.5, 0.3]})
    inputs = TargetInputs(victims_frame(), fl, pd.DataFrame(), pd.DataFrame())
    table = build_table({"rows": ["series"], "metrics": ["accuracy", "fallback_rate"]}, inputs)
    assert table.set_index("series")["fallback_rate"].to_dict() == pytest.approx(
        {"official": 0.4, "orthogonal": 0.0})


def test_comparison_puts_the_paper_beside_us_and_counts_agreeing_orders():
    inputs = TargetInputs(victims_frame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    table = build_table({"rows": ["dataset", "series"], "metrics": ["asr"]}, inputs)
    reference = {"source": "x", "columns": ["dataset", "series", "asr"],
                 "rows": [["mnist", "A", 0.8], ["mnist", "B", 0.4], ["cifar10", "A", 0.1],
                          ["cifar10", "B", 0.9]]}
    comparison, agreement = compare(table, ["dataset", "series"], reference)
    row = comparison[(comparison["dataset"] == "mnist") & (comparison["series"] == "A")].iloc[0]
    assert row["asr"] == 0.5 and row["asr_paper"] == 0.8 and row["asr_diff"] == pytest.approx(-0.3)
    # mnist: A (0.5) == B (0.5) while the paper has A > B: disagree; cifar10: A > B vs A < B
    assert agreement == {"asr": "0/2"}


def test_a_reference_cell_is_compared_as_its_kind():
    """A ratio to a baseline row and a reduction from one are computed from our rows the
    same way; a bound is kept (difference 0) or missed by how much; bounds are not ordered."""
    table = pd.DataFrame({"round": [0, 0, 0, 9, 9], "defense": ["none", "dp", "rec", "dp", "rec"],
                          "mse": [0.01, 0.02, 0.1, 0.04, 0.08]})
    reference = {"source": "x", "columns": ["round", "defense", "mse"], "rows": [
        [0, "rec", {"ratio": 8.2, "to": {"defense": "dp"}}],
        [9, "rec", {"ratio": 2.5, "to": {"defense": "dp"}}],
        [0, "dp", {"reduction": -0.5, "from": {"defense": "none"}}],
        [9, "dp", {"<": 0.03}], [0, "none", {">": 0.005}], [9, "none", 0.3]]}
    comparison, agreement = compare(table, ["defense", "round"], reference)
    got = comparison.set_index(["round", "defense"])
    assert got.loc[(0, "rec"), "mse"] == pytest.approx(5.0)  # 0.1 / 0.02
    assert got.loc[(0, "rec"), "mse_diff"] == pytest.approx(5.0 - 8.2)
    assert got.loc[(9, "rec"), "mse"] == pytest.approx(2.0)
    assert got.loc[(0, "dp"), "mse"] == pytest.approx(-1.0)  # 1 - 0.02 / 0.01
    assert got.loc[(9, "dp"), "mse_diff"] == pytest.approx(0.01)  # 0.04 misses < 0.03
    assert got.loc[(0, "none"), "mse_diff"] == 0.0  # 0.01 keeps > 0.005
    assert np.isnan(got.loc[(9, "none"), "mse"])  # no such row of ours
    assert got.loc[(0, "rec"), "mse_kind"] == "ratio to defense=dp"
    assert got.loc[(9, "dp"), "mse_kind"] == "< bound"
    shown = beside(comparison).set_index(["round", "defense"])["mse"]  # the report's cells
    assert shown[(9, "dp")] == "0.04 (< 0.03)"
    assert shown[(0, "rec")] == "5 (8.2, ratio to defense=dp)"
    # round 0 orders rec's ratio (8.2) against dp's reduction (-0.5): ours 5.0 > -1.0 agrees
    assert agreement == {"mse": "1/1"}
    assert "mse_kind" not in compare(table, ["defense", "round"], {
        "source": "x", "columns": ["round", "defense", "mse"], "rows": [[0, "dp", 0.02]]})[0]


def test_a_cell_with_best_picks_its_row_among_those_that_keep_its_bounds():
    """Refiner Figs. 7 and 10: no strength named, so the largest (or smallest) value over a
    defense's strengths whose PMM keeps the bound, and a difference between two such picks."""
    table = pd.DataFrame({"defense": ["ref"] * 3 + ["sot"] * 3, "strength": [1, 2, 3] * 2,
                          "pmm": [99.5, 99.2, 90.0, 99.9, 98.0, 80.0],
                          "noise_ratio": [0.1, 0.35, 0.6, 0.15, 0.3, 0.5],
                          "psnr": [20.0, 17.0, 12.0, 21.0, 19.0, 10.0]})
    over = {"pmm": {">": 99}}
    reference = {"source": "x", "columns": ["defense", "noise_ratio", "psnr"],
                 "rows": [["ref", {"value": 0.3, "best": "max", "over": over},
                           {"difference": -3, "to": {"defense": "sot"}, "best": "min",
                            "over": {"pmm": {">": 95}}}],
                          ["sot", {"value": 0.2, "best": "max", "over": over}, None]]}
    comparison, agreement = compare(table, ["defense", "strength"], reference)
    got = comparison.set_index("defense")
    assert got.loc["ref", "noise_ratio"] == pytest.approx(0.35)  # strength 3 loses PMM
    assert got.loc["sot", "noise_ratio"] == pytest.approx(0.15)
    assert got.loc["ref", "psnr"] == pytest.approx(17.0 - 19.0)
    assert got.loc["ref", "psnr_diff"] == pytest.approx(1.0)
    assert got.loc["ref", "noise_ratio_kind"] == "value, max over rows with pmm > 99"
    assert got.loc["ref", "psnr_kind"] == "difference to defense=sot, min over rows with pmm > 95"
    assert agreement["noise_ratio"] == "1/1"  # 0.35 > 0.15 as 0.3 > 0.2


@pytest.mark.parametrize("cell, message", [
    ({"ratio": 2.0, "to": {"attack": "dlg"}}, "names 'attack'"),
    ({"ratio": 2.0}, "reference.t.rows"),
    ({"~": 0.3}, "reference.t.rows"),
    ({"value": 0.3, "over": {"pmm": {">": 99}}}, "reference.t.rows"),  # over without best
    ({"value": 0.3, "best": "max", "over": {"pmm": {">": 99, "<": 100}}}, "reference.t.rows"),
    ({"<": 0.3, ">": 0.1}, "reference.t.rows"),
])
def test_a_reference_cell_of_unknown_form_or_baseline_is_refused(cell, message):
    with pytest.raises(config.ConfigError, match=message):
        configuration.validate({"attacks": {"dlg": {}}, "targets": {"t": {
            "title": "t", "select": [{}], "table": {"rows": ["defense"], "metrics": ["psnr"]}}},
            "reference": {"t": {"source": "x", "columns": ["defense", "psnr"],
                                "rows": [["none", cell]]}}})


@pytest.mark.slow
def test_snapshots_record_the_reconstruction_at_chosen_iterations(digits):
    model, x, y = victims(digits, 1)[0]
    ctx = defenses.DefenseContext(model, x, y)
    obs = attacks.Observation(model=model, gradient=defenses.build("none")(ctx), batch_size=1)
    stopper = {"kind": "hybrid", "threshold": 1e-5, "patience": 15}
    rec = attacks.build("idlg", iterations=300, stopper=stopper)(obs, snapshots=[0, 1, 5, 300])
    assert set(rec.snapshots) == {0, 1, 5, 300}
    assert rec.iterations < 300  # stopped early: the later snapshot is the final image
    assert torch.equal(rec.snapshots[300], rec.images)
    assert not torch.equal(rec.snapshots[0], rec.snapshots[5])
    recs = attacks.reconstruct_all(attacks.build("inverting_gradients", iterations=3),
                                   [obs, obs], snapshots=[0, 3])
    assert all(set(r.snapshots) == {0, 3} for r in recs)
    with pytest.raises(ValueError, match="cannot record snapshots"):
        attacks.reconstruct_all(attacks.build("gradinversion", bn="none"), [obs], snapshots=[1])


def test_stand_in_data_has_the_paper_dataset_shape_and_classes():
    from gradleak.data import datasets

    mnist = datasets.load("mnist", root="nowhere", split="test", download=False,
                          stand_in="digits")
    assert tuple(mnist.x.shape[1:]) == (1, 28, 28) and mnist.num_classes == 10
    cifar100 = datasets.load("cifar100", root="nowhere", stand_in="fake")
    assert tuple(cifar100.x.shape[1:]) == (3, 32, 32) and cifar100.num_classes == 100
    spec = {"root": "nowhere", "size": 64, "max_images": 400, "stand_in": "digits"}
    imagenet = datasets.load("imagenet", **spec)
    assert tuple(imagenet.x.shape) == (400, 3, 64, 64) and datasets.size("imagenet", spec) == 400
    every = datasets.load("imagenet", **{**spec, "max_images": 9999})
    assert torch.equal(imagenet.x, every.x[:400])
    small = datasets.load("imagenet", **{**spec, "size": 32})  # resized as its loader would
    assert tuple(small.x.shape) == (400, 3, 32, 32) and small.num_classes == 1000
    assert "torchvision.datasets.MNIST" in datasets.missing("mnist", {"root": "nowhere"})


def test_a_torchvision_dataset_keeps_its_first_max_images(tmp_path, monkeypatch):
    """CIFAR-10's test batch in its own format (a pickle of uint8 rows and labels; the
    integrity check, md5 of the real files, let through): ``max_images`` keeps the first
    images in file order, and the planned size says so."""
    import pickle

    import torchvision.datasets.cifar

    from gradleak.data import datasets

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rows = np.random.default_rng(0).integers(0, 256, (12, 3 * 32 * 32), dtype=np.uint8)
    with (folder / "test_batch").open("wb") as f:
        pickle.dump({"data": rows, "labels": list(range(10)) + [0, 1]}, f)
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump({"label_names": [str(i) for i in range(10)]}, f)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a: True)
    every = datasets.load("cifar10", root=str(tmp_path), split="test")
    first = datasets.load("cifar10", root=str(tmp_path), split="test", max_images=5)
    assert tuple(every.x.shape) == (12, 3, 32, 32) and tuple(first.x.shape) == (5, 3, 32, 32)
    assert torch.equal(first.x, every.x[:5]) and first.y.tolist() == [0, 1, 2, 3, 4]
    assert torch.equal(every.x[3] * 255, torch.from_numpy(rows[3].reshape(3, 32, 32)).float())
    assert datasets.size("cifar10", {"split": "test"}) == 10000
    assert datasets.size("cifar10", {"split": "test", "max_images": 5}) == 5
    assert datasets.size("cifar10", {"stand_in": "digits", "max_images": 400}) == 400


def test_fl_history_records_the_test_loss(digits):
    from gradleak.fl import FLSettings, run_federated
    from gradleak.models import LeNet

    train = type(digits)(digits.x[:200], digits.y[:200], 10)
    settings = FLSettings.from_config(
        configuration.validate({"fl": {"rounds": 2, "eval_every": 1}})["fl"])
    torch.manual_seed(0)
    history = run_federated(LeNet(1, 10, 32), train, train, [np.arange(100), np.arange(100, 200)],
                            defenses.build("none"), settings, seed=0, progress=False)
    assert [h["round"] for h in history] == [0, 1, 2]
    assert all(h["test_loss"] > 0 for h in history)


def test_a_line_figure_gives_each_hue_one_colour_in_every_panel():
    from gradleak.report.target_curves import line_figure

    frame = pd.DataFrame({"dataset": ["a", "a", "b", "b", "b", "b"],
                          "series": ["Q", "R", "P", "Q", "P", "Q"],
                          "round": [0, 0, 0, 0, 1, 1], "ssim": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    inputs = TargetInputs(frame, pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    fig = line_figure({"x": "round", "y": "ssim", "hue": "series", "panels": "dataset"},
                      inputs, "t")
    colours = [{line.get_label(): line.get_color() for line in ax.get_lines()
                if not line.get_label().startswith("_")} for ax in fig.axes]
    assert colours[0]["Q"] == colours[1]["Q"]
    assert len({*colours[0].values(), *colours[1].values()}) == 3


def test_victims_with_distinct_labels_and_the_best_image_of_each_batch(tmp_path):
    """GIAS Fig. 4 / Fig. 5 protocol: B images of B different labels per victim, and each
    image metric's best image in the batch beside the batch mean."""
    from gradleak.experiment.victims import victim_batches as _victim_batches
    from gradleak.report.tables import victim_rows
    from gradleak.utils.io import write_json

    labels = np.repeat(np.arange(10), 30)
    spec = {"victims": {"count": 12, "distinct_labels": True, "stride": 0, "class": None},
            "protocol": {"batch_size": 8}}
    batches = _victim_batches(labels, spec, np.random.default_rng(0))
    assert all(len(set(labels[b])) == 8 for b in batches)
    assert len(set(np.concatenate(batches))) == 96  # disjoint
    again = _victim_batches(labels, spec, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    plain = _victim_batches(labels, {**spec, "victims": {**spec["victims"],
                                                         "distinct_labels": False}},
                            np.random.default_rng(0))
    assert any(len(set(labels[b])) < 8 for b in plain)  # random batches repeat labels
    with pytest.raises(ValueError, match="batch_size 11 .* at least 11 classes; the data have 10"):
        _victim_batches(labels, {**spec, "protocol": {"batch_size": 11}},
                        np.random.default_rng(0))

    victim = {"victim": 0, "label": [1, 2], "predicted_label": [1, 2], "iterations": 3,
              "wall_time": 0.1, "stop_reason": "budget", "psnr": 15.0,
              "psnr_per_image": [10.0, 20.0], "mse": 0.2, "mse_per_image": [0.3, 0.1]}
    path = tmp_path / "metrics.json"
    write_json(path, {"case": "c", "setting": "none-0", "defense": "none", "strength": 0,
                      "seed": 0, "runs": {"gi_x": {"victims": [victim]}}})
    row = victim_rows(path)[0]
    assert (row["psnr_best"], row["mse_best"]) == (20.0, 0.1)


def test_a_target_may_draw_the_papers_panels_as_several_figures():
    base = {"attacks": {"dlg": {}}}
    figure = [{"kind": "line", "x": "attack", "y": ["psnr", "psnr_best"]},
              {"kind": "trace", "hue": "attack"}]
    checked = configuration.validate({**base, "targets": {"fig4": {
        "title": "t", "select": [{}], "figure": figure}}})
    assert [p for p, _ in config.figure_specs(checked["targets"]["fig4"])] == ["a", "b"]
    with pytest.raises(config.ConfigError, match="several y metrics .* no hue"):
        configuration.validate({**base, "targets": {"fig4": {
            "title": "t", "select": [{}], "figure": {
                "kind": "line", "x": "attack", "y": ["psnr", "psnr_best"], "hue": "attack"}}}})


def test_the_report_says_what_stands_in_for_the_papers_data_and_priors(tmp_path):
    from gradleak.experiment.phases.aggregate import substitutions
    from gradleak.report.markdown import write_report

    path = REPO / "config" / "paper" / "gias.yaml"
    smoke = substitutions(configuration.validate({**config.read(path), "scale": "smoke"}))
    assert any(line.startswith("`imagenet` (3x64x64, 1000 classes) is the `digits` stand-in")
               for line in smoke)
    assert any("`cifar10`" in line and "FakeData" in line for line in smoke)  # a prior's data
    assert "on the public split of cifar10, ffhq, imagenet" in smoke[-1]
    full = substitutions(configuration.load(path))
    assert len(full) == 1 and "DCGANs" in full[0]  # the real data; the priors still stand in
    from gradleak.report.target_data import TargetResult

    target = TargetResult("fig1", "Fig. 1", None, None, {}, [])
    report = write_report({}, [], [target], tmp_path / "report.md",
                          substitutions=smoke).read_text()
    assert "## Stand-ins\n\n- `cifar10`" in report


def test_targets_follow_the_papers_numbering_the_appendix_last():
    names = ["figa1", "fig10", "table1", "fig2", "figa3", "tablea1", "fig1", "table10"]
    assert sorted(names, key=plan.target_order) == [
        "table1", "table10", "tablea1", "fig1", "fig2", "fig10", "figa1", "figa3"]
