"""Tests for gradleak.report: tables, deterministic figures and the markdown report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from gradleak.report import save_figure, write_figures, write_report, write_tables
from gradleak.report.figures import evalnet_monotonicity
from gradleak.report.tables import EVALNET_COLUMNS, PRIVACY_COLUMNS, TRADEOFF_COLUMNS

CASE = "digits-lenet-iid"
SETTINGS = [("none", 0.0), ("dp_gaussian", 0.01), ("dp_gaussian", 0.1)]
ATTACKS = ["dlg", "inverting_gradients"]
ACCURACY = {("none", 0.0): 0.9, ("dp_gaussian", 0.01): 0.81, ("dp_gaussian", 0.1): 0.45}


def _write_json(path: Path, obj: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, sort_keys=True, allow_nan=True))
    return path


def _psnr(strength: float, attack: str, seed: int, victim: int) -> float:
    return 30.0 - 100 * strength + (2 if attack == "dlg" else 0) + seed + 0.5 * victim


def _evalnet(tmp: Path, dataset: str, predictions: list[float]) -> Path:
    points = [{"ratio": (i + 1) / 10, "prediction": p} for i, p in enumerate(predictions)]
    return _write_json(tmp / "evalnet" / f"{dataset}.json",
                       {"dataset": dataset, "monotonicity": points, "max_error": 0.05})


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, list[Path]]:
    """Fake FL, attack and evalnet outputs for one case."""
    rng = np.random.default_rng(0)
    root = tmp_path / "results"
    fl, attacks = [], []
    for defense, strength in SETTINGS:
        setting = f"{defense}-{strength:g}"
        for seed in (0, 1):
            keys = {"case": CASE, "setting": setting, "defense": defense, "strength": strength,
                    "seed": seed}
            fl.append(_write_json(
                root / "fl" / CASE / setting / f"seed{seed}" / "metrics.json",
                {**keys, "history": [{"round": 0, "accuracy": 0.1, "test_loss": 2.3}],
                 "final_accuracy": ACCURACY[defense, strength] - 0.01 * seed}))
            job = root / "attacks" / CASE / setting / f"seed{seed}"
            runs = {}
            for attack in ATTACKS:
                runs[attack] = {"victims": [
                    {"victim": v, "label": v, "predicted_label": 0, "stop_reason": "threshold",
                     "psnr": _psnr(strength, attack, seed, v), "ssim": 0.95 - 0.1 * v,
                     "mse": 0.001, "lpips": float("nan"), "stlpips": 0.1 * strength,
                     "noise_ratio": strength,
                     "iterations": 10 + v, "final_loss": 1e-6, "wall_time": 0.5}
                    for v in (0, 1)
                ]}
                (job / "details").mkdir(parents=True, exist_ok=True)
                mpimg.imsave(job / "details" / f"recon_{attack}.png", rng.random((16, 40, 3)))
            attacks.append(_write_json(job / "metrics.json", {
                **keys, "runs": runs, "snapshots": [], "lpips_unavailable": "not installed"}))
    evalnet = [_evalnet(root, "digits", [0.08, 0.2, 0.33, 0.41, 0.5, 0.62, 0.7, 0.79, 0.91])]
    return {"fl": fl, "attack": attacks, "evalnet": evalnet}


def _tables(inputs: dict[str, list[Path]], root: Path) -> dict[str, pd.DataFrame]:
    return write_tables(inputs["fl"], inputs["attack"], inputs["evalnet"], root / "tables")


def _build(inputs: dict[str, list[Path]], root: Path) -> tuple[dict[str, pd.DataFrame], list[Path]]:
    tables = _tables(inputs, root)
    return tables, write_figures(tables, inputs["attack"], root / "figures")


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_tables(inputs: dict[str, list[Path]], tmp_path: Path) -> None:
    root = tmp_path / "results"
    tables = _tables(inputs, root)
    utility, privacy, tradeoff = tables["utility"], tables["privacy"], tables["tradeoff"]
    assert len(utility) == 6 and len(privacy) == 3 * 2 * 2 * 2 and len(tradeoff) == 3 * 2
    assert list(privacy.columns) == PRIVACY_COLUMNS
    assert list(tradeoff.columns) == TRADEOFF_COLUMNS
    assert (utility.loc[utility["defense"] == "none", "pmm"] == 100.0).all()
    assert utility["pmm"].iloc[0] == pytest.approx(100 * 0.81 / 0.9)  # dp 0.01, seed 0
    row = tradeoff[(tradeoff["strength"] == 0.1) & (tradeoff["attack"] == "dlg")].iloc[0]
    expected = np.mean([_psnr(0.1, "dlg", s, v) for s in (0, 1) for v in (0, 1)])
    assert row["psnr"] == pytest.approx(expected)
    assert row["accuracy"] == pytest.approx(np.mean([0.45, 0.44]))
    assert (row["success_rate"], row["label_accuracy"], row["victims"]) == (0.5, 0.5, 4)
    assert np.isnan(row["lpips"])
    csv = pd.read_csv(root / "tables" / "utility.csv")
    assert list(csv.columns) == list(utility.columns) and len(csv) == 6


def test_monotonic_flag(tmp_path: Path) -> None:
    files = [_evalnet(tmp_path, "up", [0.1, 0.2, 0.3]), _evalnet(tmp_path, "dip", [0.1, 0.3, 0.2])]
    table = write_tables([], [], files, tmp_path / "tables")["evalnet_monotonicity"]
    assert list(table.columns) == EVALNET_COLUMNS
    assert table.groupby("dataset")["monotonic"].first().to_dict() == {"dip": False, "up": True}
    assert table.loc[table["dataset"] == "dip", "increasing"].tolist() == [True, True, False]
    assert np.allclose(table.loc[table["dataset"] == "dip", "error"], [0.0, 0.1, 0.1])


def test_the_report_says_whether_the_evaluation_network_is_within_its_stated_error() -> None:
    from gradleak.report.markdown import _evalnet_lines

    table = pd.DataFrame({"dataset": ["good"] * 2 + ["off"] * 2, "ratio": [0.1, 0.2] * 2,
                          "error": [0.01, 0.04, 0.02, 0.12], "monotonic": True,
                          "max_error": 0.05})
    good, off = _evalnet_lines(table)
    assert "at most 0.040 from the ratio (within the stated 0.05)" in good
    assert "at most 0.120 from the ratio (**beyond** the stated 0.05)" in off


def test_empty_inputs(tmp_path: Path) -> None:
    tables = write_tables([], [], [], tmp_path / "tables")
    assert all(df.empty for df in tables.values())
    assert list(tables["tradeoff"].columns) == TRADEOFF_COLUMNS
    assert write_figures(tables, [], tmp_path / "figures") == []


@pytest.mark.slow
def test_figures_deterministic(inputs: dict[str, list[Path]], tmp_path: Path) -> None:
    root = tmp_path / "results"
    _, figures = _build(inputs, root)
    names = {p.name for p in figures}
    assert names == {f"{kind}_{a}.png" for kind in ("pmm_vs_psnr", "recon") for a in ATTACKS} | {
        "evalnet_monotonicity.png", "censor_tradeoff.png", "matched_utility.png"} | {
        f"tradeoff_{m}.png" for m in ("psnr", "ssim", "lpips", "stlpips", "noise_ratio")}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in figures)
    first = {**_hashes(root / "tables"), **_hashes(root / "figures")}
    _build(inputs, root)
    assert {**_hashes(root / "tables"), **_hashes(root / "figures")} == first


@pytest.mark.parametrize("suffix", ["png", "svg", "pdf"])
def test_save_figure_deterministic(tmp_path: Path, suffix: str) -> None:
    files = [_evalnet(tmp_path, "digits", [0.1, 0.5])]
    table = write_tables([], [], files, tmp_path)["evalnet_monotonicity"]
    paths = [save_figure(evalnet_monotonicity(table), tmp_path / f"f{i}.{suffix}") for i in (0, 1)]
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temp files left
    assert paths[0].read_bytes() == paths[1].read_bytes()


@pytest.mark.slow
def test_report(inputs: dict[str, list[Path]], tmp_path: Path) -> None:
    root = tmp_path / "results"
    tables, figures = _build(inputs, root)
    report = write_report(tables, figures, [], root / "report.md")
    text = report.read_text()
    assert text.startswith("# gradleak report")
    for fig in figures:
        assert f"](figures/{fig.name})" in text
    assert "`digits`: monotonic" in text and "inverting_gradients" in text


def test_malformed_file(inputs: dict[str, list[Path]], tmp_path: Path) -> None:
    root = tmp_path / "results"
    bad = _write_json(root / "bad" / "metrics.json", {"case": CASE, "seed": 0})
    with pytest.raises(ValueError, match=r"bad.*metrics\.json.*'setting'"):
        write_tables([*inputs["fl"], bad], [], [], root / "tables")
    bad = _write_json(bad, {"case": CASE, "setting": "none-0", "defense": "none", "strength": 0,
                            "seed": 0, "runs": {"dlg": {"victims": [{"victim": 0}]}}})
    with pytest.raises(ValueError, match=r"missing key 'label' in runs\['dlg'\]\.victims\[0\]"):
        write_tables([], [bad], [], root / "tables")


def _tradeoff_rows(rows: list[tuple]) -> pd.DataFrame:
    keys = ["case", "defense", "strength", "attack", "pmm", "psnr", "ssim", "mse", "lpips",
            "stlpips", "noise_ratio"]
    return pd.DataFrame.from_records(rows, columns=keys).assign(attacker="paper")


def test_censor_table_has_one_row_per_setting_and_four_metrics_per_attack() -> None:
    from gradleak.report.tables import censor_table

    tradeoff = _tradeoff_rows([
        ("c", "none", 0.0, "dlg", 100, 30.0, 0.9, 0.001, np.nan, 0.3, 0.1),
        ("c", "none", 0.0, "ig", 100, 20.0, 0.7, 0.01, np.nan, 0.3, 0.2),
        ("c", "censor", 20.0, "dlg", 98, 5.0, 0.1, 0.3, np.nan, 0.3, 0.5),
        ("c", "censor", 20.0, "ig", 98, 6.0, 0.1, 0.2, np.nan, 0.3, 0.5),
        ("c", "refiner~beta=0", 0.1, "ig", 97, 9.0, 0.2, 0.1, np.nan, 0.3, 0.4),
    ])
    utility = pd.DataFrame({"case": ["c"] * 4, "defense": ["none", "none", "censor", "censor"],
                            "strength": [0.0, 0.0, 20.0, 20.0], "final_accuracy": [0.9] * 4,
                            "fallback_rate": [0.0, 0.0, 0.25, 0.75]})
    table = censor_table(tradeoff, utility)
    assert table[["defense", "strength"]].values.tolist() == [["censor", 20.0], ["none", 0.0]]
    assert set(table["protocol"]) == {""}  # as configured
    assert list(table.columns[4:]) == ["accuracy", "fallback_rate"] + [
        f"{a}_{m}" for a in ("dlg", "ig") for m in ("mse", "lpips", "stlpips", "psnr", "ssim")]
    assert table.loc[table["defense"] == "censor", "ig_psnr"].item() == 6.0
    assert table.loc[table["defense"] == "censor", "fallback_rate"].item() == 0.5


def test_censor_tradeoff_labels_each_setting_with_its_fallback_rate() -> None:
    from gradleak.report.figures import censor_tradeoff

    table = pd.DataFrame({"case": ["c"] * 3, "protocol": [""] * 3,
                          "defense": ["none", "censor", "censor_alg1"],
                          "strength": [0.0, 5.0, 5.0], "accuracy": [0.9, 0.1, 0.85],
                          "fallback_rate": [0.0, 0.0, 0.4], "dlg_psnr": [30.0, 8.0, 29.0],
                          "ig_psnr": [20.0, 7.0, 19.0]})
    fig = censor_tradeoff(table)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["dlg", "ig"]
    assert sorted(t.get_text() for t in axes[0].texts) == ["0", "5", "5 (40% clean)"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "censor", "censor_alg1", "none"]


def test_a_protocol_s_overrides_are_its_own_rows_of_table_i_not_an_ablation() -> None:
    """A configuration whose only protocol has overrides (``protocols: {fedavg:
    {fl.local_steps: 5}}``) tabulates and draws CENSOR's Table I under it; with two
    protocols each has its rows, its FL run's accuracy and its panels."""
    from gradleak.report.figures import censor_tradeoff
    from gradleak.report.tables import censor_table

    fedavg, batch = "~fl.local_steps=5", "~fl.local_steps=5~attack.protocol.batch_size=4"
    tradeoff = _tradeoff_rows([
        ("c", "none" + fedavg, 0.0, "ig", 100, 20.0, 0.7, 0.01, np.nan, 0.3, 0.2),
        ("c", "censor" + fedavg, 20.0, "ig", 98, 6.0, 0.1, 0.2, np.nan, 0.3, 0.5),
        ("c", "censor" + batch, 20.0, "ig", 98, 9.0, 0.2, 0.1, np.nan, 0.3, 0.4),
    ])
    utility = pd.DataFrame({"case": ["c"] * 2, "defense": ["none" + fedavg, "censor" + fedavg],
                            "strength": [0.0, 20.0], "final_accuracy": [0.9, 0.7],
                            "fallback_rate": [0.0, 0.25]})
    table = censor_table(tradeoff, utility)
    assert table[["protocol", "defense", "ig_psnr", "accuracy"]].values.tolist() == [
        [fedavg[1:], "censor", 6.0, 0.7], [fedavg[1:], "none", 20.0, 0.9],
        [batch[1:], "censor", 9.0, 0.7]]  # the batch protocol attacks the same FL run
    fig = censor_tradeoff(table)
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == [
        "ig — fl.local_steps=5", "ig — fl.local_steps=5, attack.protocol.batch_size=4"]
    from gradleak.report.figures import pmm_vs_psnr, tradeoff_panels

    titles = [ax.get_title() for ax in tradeoff_panels(tradeoff, "psnr").axes
              if ax.get_visible()]
    assert titles == ["ig — fl.local_steps=5",
                      "ig — fl.local_steps=5, attack.protocol.batch_size=4"]
    assert [ax.get_title() for ax in pmm_vs_psnr(tradeoff.iloc[:2], "ig").axes
            if ax.get_visible()] == ["c"]  # the only protocol is no ablation: drawn
    only = censor_table(tradeoff.iloc[:2], utility)
    assert only["defense"].tolist() == ["censor", "none"]
    assert [ax.get_title() for ax in censor_tradeoff(only).axes if ax.get_visible()] == ["ig"]
