"""Studies: targets measured without FL or attack runs (``study:`` in place of ``select``),
with Refiner Fig. 3's perturbation MSEs as the first."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
from conftest import REPO

from gradleak import config
from gradleak.experiment import configuration, paths, pipeline, plan
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.experiment.phases.study import run as run_study
from gradleak.experiment.phases.target import target_files, write_target
from gradleak.experiment.studies.perturbation import perturbations
from gradleak.report import load_target

REFINER = config.read(REPO / "config" / "paper" / "refiner.yaml")


def test_the_perturbations_are_what_they_say():
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    out = perturbations(x, shift=1, scale=0.5, noise=0.1,
                        generator=torch.Generator().manual_seed(1))
    assert torch.equal(out["shift"][..., :-1, :-1], x[..., 1:, 1:])  # content moved up-left
    assert torch.equal(out["scale"], x * 0.5)
    noise = out["noise"] - x
    assert noise.abs().max() <= 0.1 + 1e-7 and noise.abs().max() > 0.05


@pytest.mark.slow
def test_fig3_is_a_study_that_plans_no_run():
    refiner = configuration.validate(copy.deepcopy(REFINER))
    assert "fig3" in plan.studies(refiner)
    assert all(p.target != "fig3" for p in plan.points(refiner))
    assert refiner["targets"]["fig3"]["study"] == {
        "kind": "perturbation", "dataset": "natural", "images": 100, "shift": 1, "scale": 0.5,
        "noise": 0.11, "seed": 0}
    assert target_files(refiner, paths.Path("r"), "fig3") == [
        paths.study_dir(paths.Path("r"), "fig3")]
    results = paths.Path("r")
    assert paths.data_manifest(results, "natural") in pipeline.outputs_of(
        refiner, results, ["prepare_data"], pipeline.walk(refiner, results))


@pytest.mark.parametrize("change, message", [
    (lambda t: t.update(select=[{"attacks": []}]), r"'targets.fig3': expected either 'select' "
                                                   r".* or 'study' .*, not both"),
    (lambda t: t.pop("study"), r"'targets.fig3': expected either .*found neither"),
    (lambda t: t["study"].update(dataset="cifar11"), r"'targets.fig3.study.dataset': 'cifar11' is "
                                                  r"not a configured dataset"),
    (lambda t: t["study"].update(images=5000), r"'targets.fig3.study.images' 5000 is more than "
                                               r"the test split of 'natural' holds"),
    (lambda t: t["study"].update(shift=0), r"'targets.fig3.study.shift': 0 is less than"),
    (lambda t: t["study"].update(kind="blend"), r"'targets.fig3.study.kind': 'blend' is not "
                                                r"one of \['perturbation'"),
    (lambda t: t["table"].update(metrics=["psnr"]), r"'psnr' is not a metric of a perturbation "
                                                    r"study \(expected one of \['mse'\]\)"),
    (lambda t: t["table"].update(rows=["defense"]), r"'defense' is not a column of its results"),
])
def test_a_bad_study_is_refused_naming_the_key(change, message):
    bad = copy.deepcopy(REFINER)
    change(bad["targets"]["fig3"])
    with pytest.raises(config.ConfigError, match=message):
        configuration.validate(bad)


def test_a_study_target_from_measurement_to_comparison(tmp_path):
    smoke = configuration.validate({**copy.deepcopy(REFINER), "scale": "smoke"})
    prepare_data(smoke, tmp_path, "natural")
    run_study(smoke, tmp_path, "fig3")
    again = tmp_path / "again"
    prepare_data(smoke, again, "natural")
    run_study(smoke, again, "fig3")
    for name in ("metrics.json", "images.npy", "images_titles.npy"):  # same bytes
        assert (paths.study_dir(tmp_path, "fig3") / name).read_bytes() == (
            paths.study_dir(again, "fig3") / name).read_bytes()
    write_target(smoke, tmp_path, "fig3")
    result = load_target(paths.target_dir(tmp_path, "fig3"))
    table = result.table.set_index("perturbation")["mse"]
    assert list(table.index) == ["noise", "scale", "shift"]
    # MSE ranks the visible-but-harmless perturbations above the noise, as in the paper
    assert table["scale"] > table["shift"] > table["noise"] > 0
    assert result.agreement == {"mse": "3/3"}
    assert isinstance(result.comparison, pd.DataFrame) and len(result.comparison) == 3
    assert (paths.target_dir(tmp_path, "fig3") / "fig3.png").stat().st_size > 0


def test_a_study_asking_for_more_images_than_prepared_fails_before_measuring(tmp_path):
    smoke = configuration.validate({**copy.deepcopy(REFINER), "scale": "smoke"})
    smoke["targets"]["fig3"]["study"]["images"] = 40  # under the bound, over the 18 there
    prepare_data(smoke, tmp_path, "natural")
    with pytest.raises(ValueError, match=r"'images' 40 is more than the \d+ test images of "
                                         r"'natural'"):
        run_study(smoke, tmp_path, "fig3")
    assert not paths.study_dir(tmp_path, "fig3").exists()
