"""The device script's choice of left-out claims (benchmarks/device_claims.py): the cheapest
that fit the budget, never a claim left out for its data."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
from conftest import REPO

spec = importlib.util.spec_from_file_location("device_claims",
                                              REPO / "benchmarks" / "device_claims.py")
device_claims = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device_claims)


def _priced(gpu: list) -> pd.DataFrame:
    return pd.DataFrame({"jobs": [3, 4, 5, 6], "cpu_hours": [8.0, 16.0, 2.0, 1.0],
                         "gpu_hours": gpu}, index=["a", "b", "c", "stand"])


def test_the_cheapest_left_out_claims_that_fit_the_budget_are_chosen():
    left_out = {"a": "Refiner's runs", "b": "Refiner's runs", "c": "Soteria's runs",
                "stand": "the stand-in: one set of photographs"}
    chosen, hours = device_claims.choose(left_out, _priced([0.05, 0.1, 0.02, 0.01]), 5, 16)
    assert chosen == ["c", "a"] and abs(hours - 0.07) < 1e-9  # 4.2 minutes; b would pass 5
    # without a GPU price, CPU-hours over the cores
    chosen, hours = device_claims.choose(left_out, _priced([None] * 4), 60, 16)
    assert chosen == ["c", "a"] and abs(hours - 10 / 16) < 1e-9
    assert device_claims.choose(left_out, _priced([None] * 4), 1, 16) == ([], 0.0)


def test_a_copy_of_the_configuration_still_finds_the_paper_s_numbers(tmp_path):
    """CENSOR names its paper's numbers by files beside its configuration; the copies the
    script writes elsewhere name them by absolute paths; ``--model`` moves the reduced scale's
    cases onto the paper's model."""
    raw = device_claims.read(REPO / "config" / "paper" / "censor.yaml")
    files = [entry["file"] for entry in raw["reference"].values() if "file" in entry]
    assert files and all(Path(f).is_absolute() and Path(f).is_file() for f in files)
    on_resnet = device_claims.read(REPO / "config" / "paper" / "censor.yaml", "resnet18")
    assert {case["model"] for case in on_resnet["reduced_overrides"]["cases"]} == {"resnet18"}
    assert [c["dataset"] for c in on_resnet["reduced_overrides"]["cases"]] == \
        ["imagenet", "ffhq", "cifar10"]


def test_only_the_lenet_cases_move_to_the_paper_s_model():
    """GIAS's reduced scale keeps R-GAP's CNN6 and CNN10 (the paper's own models): on
    ResNet-18 only its LeNet cases move, so that no two cases become one."""
    on_resnet = device_claims.read(REPO / "config" / "paper" / "gias.yaml", "resnet18")
    assert [case["model"] for case in on_resnet["reduced_overrides"]["cases"]] == \
        ["resnet18", "resnet18", "cnn6", "cnn10"]
