"""The defense cost study (``defense_cost``): Refiner Table 5 and RecUP-FL Table 1 as
study targets, seconds per client update of every defense beside the undefended one."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import REPO

from gradleak import config
from gradleak.experiment import configuration, paths, plan
from gradleak.experiment.phases.study import inputs as study_inputs
from gradleak.experiment.phases.study import run as run_study
from gradleak.experiment.phases.target import target_files, write_target
from gradleak.experiment.studies import defense_cost
from gradleak.report import load_target

REFINER = config.read(REPO / "config" / "paper" / "refiner.yaml")
RECUPFL = config.read(REPO / "config" / "paper" / "recupfl.yaml")


def smoke(raw: dict, name: str, **study) -> dict:
    """The paper's smoke configuration with ``study`` over its target ``name``'s study."""
    out = configuration.validate({**copy.deepcopy(raw), "scale": "smoke"})
    out["targets"][name]["study"].update(study)
    return out


@pytest.mark.parametrize("raw, name, models, labels", [
    (REFINER, "table5", ["lenet", "resnet10", "resnet18", "resnet34"],
     ["pruning", "dp_gaussian", "dp_laplace", "quantization", "soteria", "refiner"]),
    (RECUPFL, "table1", ["attribute_cnn"],
     ["recupfl", "dp_gaussian", "dp_laplace", "pruning", "soteria"]),
])
def test_the_cost_tables_are_studies_that_plan_no_run(raw, name, models, labels):
    full = configuration.validate(copy.deepcopy(raw))
    assert name in plan.studies(full)
    assert all(p.target != name for p in plan.points(full))
    study = full["targets"][name]["study"]
    assert study["kind"] == "defense_cost"
    assert (study["models"], study["defenses"]) == (models, labels)
    assert target_files(full, paths.Path("r"), name) == [
        paths.study_dir(paths.Path("r"), name)]
    assert study_inputs(full, paths.Path("r"), name) == []  # random inputs: no dataset
    reference = full["reference"][name]
    column = reference["columns"].index("defense")
    assert {row[column] for row in reference["rows"]} == set(labels)
    small = configuration.validate({**copy.deepcopy(raw), "scale": "smoke"})
    assert small["targets"][name]["study"]["repeats"] == 2


def test_rows_cover_every_model_and_defense_with_ratios_to_the_undefended_update():
    cfg = smoke(REFINER, "table5", models=["lenet", "resnet10"], input_shape=[3, 16, 16],
                batch_size=2, defenses=["dp_gaussian", "none", "refiner"], repeats=1,
                warmup=0)
    rows = defense_cost.defense_cost(cfg, paths.Path("unused"), cfg["targets"]["table5"]["study"])
    assert [(r["model"], r["defense"]) for r in rows.rows] == [
        (m, d) for m in ("lenet", "resnet10") for d in ("none", "dp_gaussian", "refiner")]
    assert [r["strength"] for r in rows.rows[:3]] == [
        0.0, cfg["defenses"]["dp_gaussian"]["strengths"][0],
        cfg["defenses"]["refiner"]["strengths"][0]]
    for model in ("lenet", "resnet10"):
        mine = [r for r in rows.rows if r["model"] == model]
        assert mine[0]["ratio_to_none"] == 1.0
        for row in mine:
            assert row["seconds"] > 0
            assert row["ratio_to_none"] == pytest.approx(row["seconds"] / mine[0]["seconds"])


def test_recupfl_is_timed_with_an_untrained_zoo_of_the_configured_shape():
    zoo = defense_cost.untrained_zoo(["race"], {"race": 3}, feature_size=64, size=3, seed=0)
    assert (zoo.feature_size, zoo.classes, len(zoo.models["race"])) == (64, {"race": 3}, 3)
    cfg = smoke(RECUPFL, "table1", defenses=["recupfl"], repeats=1, warmup=0)
    rows = defense_cost.defense_cost(cfg, paths.Path("unused"), cfg["targets"]["table1"]["study"])
    assert [(r["model"], r["defense"]) for r in rows.rows] == [
        ("attribute_cnn", "none"), ("attribute_cnn", "recupfl")]


def test_soteria_costs_more_than_pruning_side_by_side_and_compare_agrees(tmp_path):
    # Soteria runs a backward pass per feature of the defended layer, pruning one sort:
    # orders of magnitude apart, so the order measured side by side is robust
    cfg = smoke(REFINER, "table5", input_shape=[3, 16, 16], batch_size=2,
                defenses=["pruning", "soteria"], repeats=3, warmup=1)
    run_study(cfg, tmp_path, "table5")
    write_target(cfg, tmp_path, "table5")
    result = load_target(paths.target_dir(tmp_path, "table5"))
    seconds = result.table.set_index("defense")["seconds"]
    assert seconds["soteria"] > seconds["pruning"]
    assert result.agreement["seconds"] == "1/1"  # the paper's Soteria > Pruning on LeNet
    assert (paths.target_dir(tmp_path, "table5") / "table5.png").stat().st_size > 0


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(models=["lenet5"]),
     r"'targets.table5.study.models\[0\]': 'lenet5' is not one of \['lenet'"),
    (lambda s: s.update(defenses=["pruning", "gausian"]),
     r"'targets.table5.study.defenses\[1\]': 'gausian' is not a configured defense label "
     r"\(expected one of \['dp_gaussian'"),
    (lambda s: s.update(input_shape=[3, 32]),
     r"'targets.table5.study.input_shape': \[3, 32\] is too short"),
    (lambda s: s.update(kind="defense_costs"),
     r"'targets.table5.study.kind': 'defense_costs' is not one of"),
])
def test_a_bad_cost_study_is_refused_naming_the_key(change, message):
    bad = copy.deepcopy(REFINER)
    change(bad["targets"]["table5"]["study"])
    with pytest.raises(config.ConfigError, match=message):
        configuration.validate(bad)


@pytest.mark.parametrize("raw, name, study, message", [
    (REFINER, "table5", {"input_shape": [3, 32, 24]}, r"lenet needs a square 32x32 input"),
    (REFINER, "table5", {"models": ["attribute_cnn"], "input_shape": [3, 62, 47]},
     r"defense 'refiner' needs the evaluation network, which takes square images; "
     r"input_shape \[3, 62, 47\] is not square"),
    (RECUPFL, "table1", {"attribute_classes": {}, "defenses": ["recupfl_all"]},
     r"defense 'recupfl_all' protects every attribute of its model zoo"),
])
def test_what_the_study_cannot_time_is_refused_before_any_timing(monkeypatch, raw, name,
                                                                 study, message):
    raw = copy.deepcopy(raw)
    raw["defenses"]["recupfl_all"] = {"defense": "recupfl", "strengths": [0.01],
                                      "params": {"attributes": None, "models": 2}}
    cfg = smoke(raw, name, **study)

    def no_timing(*args, **kwargs):
        raise AssertionError("timed before refusing")

    monkeypatch.setattr(defense_cost, "rotated", no_timing)
    with pytest.raises(ValueError, match=message):
        run_study(cfg, paths.Path("unused"), name)


def test_a_defense_needing_data_has_no_stand_in():
    raw = copy.deepcopy(REFINER)
    raw["defenses"]["censor_public"] = {"defense": "censor", "strengths": [4],
                                        "params": {"proposal": "public"}}
    cfg = smoke(raw, "table5", defenses=["censor_public"])
    with pytest.raises(ValueError, match=r"defense 'censor_public' needs 'public_data', for "
                                         r"which the study has no stand-in"):
        defense_cost.build_defense(cfg, cfg["targets"]["table5"]["study"], "censor_public",
                                   torch.device("cpu"))
