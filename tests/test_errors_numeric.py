"""Numerically bad runs (docs/errors.md, "Numerically bad runs"): a defense that produces
NaN, an attack that diverges or returns NaN images, metrics on NaN images. The run
finishes; metrics.json records each failure with its reason; the tables count failures
and never average a NaN into a mean."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from gradleak import metrics
from gradleak.attacks.dlg import DLG
from gradleak.attacks.inverting_gradients import InvertingGradients
from gradleak.defenses.differential_privacy import GaussianNoise
from gradleak.experiment import configuration, paths
from gradleak.experiment.phases.attack import run_attacks
from gradleak.experiment.phases.fl_run import run_fl
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.report.tables import write_tables
from gradleak.settings import Setting

CASE = "digits-lenet-iid-k4"
NONE, DP = Setting.parse("none-0"), Setting.parse("dp_gaussian-0.01")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny configuration with its data prepared and its two FL runs done."""
    results = tmp_path_factory.mktemp("numeric") / "results"
    config = configuration.validate({
        "threads": 1, "device": "cpu",
        "datasets": {"digits": {"channels": 1, "size": 16}},
        "cases": [{"dataset": "digits", "model": "lenet", "partition": {"clients": 4}}],
        "fl": {"seeds": [0], "rounds": 2, "eval_every": 1, "client_batch_size": 8},
        "defenses": {"none": {"strengths": [0]}, "dp_gaussian": {"strengths": [0.01]}},
        "attack": {"victims": {"count": 2},
                   "outputs": {"grid_victims": 2, "metrics": ["psnr", "ssim", "mse"]}},
        "attacks": {"dlg": {"iterations": 2}, "inverting_gradients": {"iterations": 3}},
    })
    prepare_data(config, results, "digits")
    for setting in (NONE, DP):
        run_fl(config, results, CASE, setting, 0)
    return config, results


def nan_noise(monkeypatch):
    """dp_gaussian's uploads become NaN: a defense that diverged."""
    clean = GaussianNoise.__call__
    monkeypatch.setattr(GaussianNoise, "__call__",
                        lambda self, ctx: clean(self, ctx).map(lambda t: t * float("nan")))


def attack_metrics(config, results, setting) -> dict:
    run_attacks(config, results, CASE, setting, 0)
    return json.loads(paths.attack_metrics(results, CASE, setting, 0).read_text())


def tables(config, results, tmp_path) -> dict[str, pd.DataFrame]:
    fl = [paths.fl_metrics(results, CASE, s, 0) for s in (NONE, DP)]
    attacked = [paths.attack_metrics(results, CASE, s, 0) for s in (NONE, DP)
                if paths.attack_metrics(results, CASE, s, 0).is_file()]
    write_tables(fl, attacked, [], tmp_path / "tables", ["utility", "privacy", "tradeoff"])
    return {name: pd.read_csv(tmp_path / "tables" / f"{name}.csv")
            for name in ("utility", "privacy", "tradeoff")}


def tradeoff_row(frames, defense, attack) -> pd.Series:
    df = frames["tradeoff"]
    return df[(df["defense"] == defense) & (df["attack"] == attack)].iloc[0]


def test_a_defense_that_makes_fl_diverge_is_recorded_not_a_crash(run, tmp_path, monkeypatch):
    config, clean = run
    results = tmp_path / "results"
    import shutil

    shutil.copytree(clean, results)
    nan_noise(monkeypatch)
    run_fl(config, results, CASE, DP, 0)
    record = json.loads(paths.fl_metrics(results, CASE, DP, 0).read_text())
    assert record["failure"].startswith("diverged: the model's weights are NaN/inf from round 1")
    assert math.isnan(record["final_accuracy"])  # not the 0.1 that argmax of NaN logits gives
    assert math.isnan(record["history"][-1]["accuracy"])
    assert record["history"][0]["accuracy"] > 0  # round 0 was before the bad upload
    frames = tables(config, results, tmp_path)
    utility = frames["utility"].set_index("defense")
    assert "diverged" in utility.loc["dp_gaussian", "failure"]
    assert pd.isna(utility.loc["none", "failure"])
    assert math.isnan(utility.loc["dp_gaussian", "pmm"])


def test_nan_uploads_are_attacked_without_a_crash_and_counted(run, tmp_path, monkeypatch):
    config, clean = run
    results = tmp_path / "results"
    import shutil

    shutil.copytree(clean, results)
    nan_noise(monkeypatch)
    record = attack_metrics(config, results, DP)
    for label in ("dlg", "inverting_gradients"):
        victims = record["runs"][label]["victims"]
        assert [v["failure"] for v in victims] == \
            ["the defended upload has NaN/inf values (the defense diverged)"] * 2
    assert {v["stop_reason"] for v in record["runs"]["dlg"]["victims"]} == {"diverged"}
    frames = tables(config, results, tmp_path)
    row = tradeoff_row(frames, "dp_gaussian", "dlg")
    assert row["failed"] == 2 and row["diverged"] == 2 and row["victims"] == 2
    assert row["success_rate"] == 0


def test_an_attack_returning_nan_images_is_a_failed_victim_never_averaged(run, tmp_path,
                                                                         monkeypatch):
    config, results = run
    real, calls = DLG.reconstruct, []

    def first_victim_nan(self, victims):
        recs = real(self, victims)
        if type(self) is DLG and not calls:  # not iDLG, which inherits it
            calls.append(1)
            recs[0].images = recs[0].images * float("nan")
        return recs

    monkeypatch.setattr(DLG, "reconstruct", first_victim_nan)
    record = attack_metrics(config, results, NONE)
    bad, good = record["runs"]["dlg"]["victims"]
    assert bad["failure"].startswith("diverged: the reconstruction has NaN/inf pixels")
    assert math.isnan(bad["psnr"]) and math.isnan(bad["ssim"])
    assert good["failure"] is None and np.isfinite(good["psnr"])
    # the bar of decision 0111 is the truth's own: measured whatever the reconstruction
    assert all(0 < v["psnr_flat"] < 100 for v in (bad, good))
    frames = tables(config, results, tmp_path)
    assert frames["privacy"]["psnr_flat"].notna().all()
    row = tradeoff_row(frames, "none", "dlg")
    assert row["failed"] == 1 and row["victims"] == 2
    assert row["psnr"] == pytest.approx(good["psnr"], rel=1e-5)  # the finite victim only
    privacy = frames["privacy"]
    assert privacy["failure"].notna().sum() == 1
    assert tradeoff_row(frames, "none", "inverting_gradients")["failed"] == 0


@pytest.mark.parametrize("error", [FloatingPointError("overflow in exp"),
                                   ZeroDivisionError("float division by zero"),
                                   torch.linalg.LinAlgError("singular matrix")],
                         ids=["floating_point", "zero_division", "linalg"])
def test_an_attack_that_breaks_down_numerically_is_recorded(run, tmp_path, monkeypatch, error):
    config, clean = run
    results = tmp_path / "results"
    import shutil

    shutil.copytree(clean, results)

    def broken(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(InvertingGradients, "reconstruct", broken)
    record = attack_metrics(config, results, NONE)
    victims = record["runs"]["inverting_gradients"]["victims"]
    assert all(type(error).__name__ in v["failure"] and str(error) in v["failure"]
               for v in victims)
    assert all(math.isnan(v["psnr"]) for v in victims)
    assert all(v["failure"] is None for v in record["runs"]["dlg"]["victims"])
    row = tradeoff_row(tables(config, results, tmp_path), "none", "inverting_gradients")
    assert row["failed"] == 2 and math.isnan(row["psnr"])


@pytest.mark.parametrize("metric", ["psnr", "ssim", "mse", "stlpips"])
@pytest.mark.parametrize("batch", [1, 3])
def test_image_metrics_on_nan_images_give_nan_not_an_exception(metric, batch):
    truth = torch.rand(batch, 1, 16, 16)
    rec = torch.rand(batch, 1, 16, 16)
    rec[0] = float("nan")
    values = getattr(metrics, metric)(rec, truth, reduction="none")
    assert np.isnan(values[0]) or batch > 1 and np.isnan(values).any()
    if batch > 1:  # the finite reconstructions keep their (finite) values
        assert np.isfinite(values).sum() == batch - 1


def test_tables_count_failures_and_average_only_finite_values(tmp_path):
    def victim(v, psnr, failure=None, stop="max_iterations"):
        return {"victim": v, "label": 1, "predicted_label": 1, "iterations": 5,
                "wall_time": 0.1, "stop_reason": stop, "psnr": psnr, "ssim": 0.5, "mse": 0.1,
                "failure": failure}

    attack = tmp_path / "attack.json"
    attack.write_text(json.dumps({
        "case": CASE, "setting": "none-0", "defense": "none", "strength": 0.0, "seed": 0,
        "runs": {"dlg": {"victims": [victim(0, 10.0), victim(1, float("nan"), "diverged: x"),
                                     victim(2, 14.0, stop="diverged")]}}}))
    fl = tmp_path / "fl.json"
    fl.write_text(json.dumps({"case": CASE, "setting": "none-0", "defense": "none",
                              "strength": 0.0, "seed": 0, "final_accuracy": 0.5,
                              "history": [{"round": 0, "accuracy": 0.5, "test_loss": 1.0}]}))
    frames = write_tables([fl], [attack], [], tmp_path / "tables",
                          ["utility", "privacy", "tradeoff"])
    row = frames["tradeoff"].iloc[0]
    assert row["psnr"] == 12.0 and row["failed"] == 1 and row["diverged"] == 1
    assert row["victims"] == 3
