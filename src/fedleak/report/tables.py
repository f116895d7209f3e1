"""Collect pipeline metrics JSON files into deterministic CSV tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from fedleak.utils.io import atomic_path

UTILITY_COLUMNS = ["case", "defense", "strength", "seed", "final_accuracy", "pmm"]
VICTIM_METRICS = ["psnr", "ssim", "mse", "lpips", "noise_ratio", "iterations"]
PRIVACY_COLUMNS = [
    "case", "defense", "strength", "attack", "seed", "victim", "label_correct",
    *VICTIM_METRICS, "stop_reason",
]
TRADEOFF_KEYS = ["case", "defense", "strength", "attack"]
TRADEOFF_COLUMNS = [
    *TRADEOFF_KEYS, "accuracy", "pmm", *VICTIM_METRICS,
    "success_rate", "label_accuracy", "victims",
]
EVALNET_COLUMNS = ["dataset", "ratio", "prediction", "increasing", "monotonic"]
FL_KEYS = ["case", "defense", "strength", "seed", "final_accuracy"]
ATTACK_KEYS = ["case", "defense", "strength", "attack", "seed", "victims"]
VICTIM_KEYS = ["victim", "label", "predicted_label", *VICTIM_METRICS, "stop_reason"]
SUCCESS_SSIM = 0.9  # EPAFL's reconstruction-success criterion


def require(record: Any, keys: list[str], path: Path, where: str = "") -> dict:
    """Return ``record`` if it is a dict holding ``keys``; else raise ValueError naming ``path``."""
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected a JSON object{where}, got {type(record).__name__}")
    for key in keys:
        if key not in record:
            raise ValueError(f"{path}: missing key {key!r}{where}")
    return record


def load_record(path: Path, keys: list[str]) -> dict:
    """Read one metrics JSON file (NaN allowed) and check its top-level keys."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON ({err})") from err
    return require(record, keys, path)


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    """Write ``df`` as a deterministic CSV, atomically."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g", lineterminator="\n")
    return Path(path)


def _frame(rows: list[dict], columns: list[str], keys: list[str]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(rows, columns=columns)
    if "strength" in df:
        df["strength"] = df["strength"].astype(float)
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def utility_table(fl_files: list[Path]) -> pd.DataFrame:
    """One row per FL run, with PMM relative to the ``none`` run of the same case and seed."""
    rows = [load_record(f, FL_KEYS) for f in fl_files]
    df = _frame(rows, UTILITY_COLUMNS[:-1], ["case", "defense", "strength", "seed"])
    base = df.loc[df["defense"] == "none", ["case", "seed", "final_accuracy"]]
    base = base.rename(columns={"final_accuracy": "base"})
    df = df.merge(base, on=["case", "seed"], how="left")
    df["pmm"] = 100.0 * df["final_accuracy"] / df["base"]
    return df[UTILITY_COLUMNS]


def privacy_table(attack_files: list[Path]) -> pd.DataFrame:
    """One row per (attack run, victim)."""
    rows = []
    for path in attack_files:
        run = load_record(path, ATTACK_KEYS)
        for i, victim in enumerate(run["victims"]):
            v = require(victim, VICTIM_KEYS, path, where=f" in victims[{i}]")
            rows.append({
                **{k: run[k] for k in ["case", "defense", "strength", "attack", "seed"]},
                **{k: v[k] for k in ["victim", *VICTIM_METRICS, "stop_reason"]},
                "label_correct": v["predicted_label"] == v["label"],
            })
    keys = [*TRADEOFF_KEYS, "seed", "victim"]
    return _frame(rows, PRIVACY_COLUMNS, keys)


def tradeoff_table(utility: pd.DataFrame, privacy: pd.DataFrame) -> pd.DataFrame:
    """Aggregate privacy per (case, defense, strength, attack) and join mean FL utility."""
    attack = privacy.assign(success=privacy["ssim"] >= SUCCESS_SSIM).groupby(TRADEOFF_KEYS)
    df = attack[VICTIM_METRICS].mean()
    df["success_rate"] = attack["success"].mean()
    df["label_accuracy"] = attack["label_correct"].mean()
    df["victims"] = attack.size()
    fl = utility.groupby(["case", "defense", "strength"])
    fl = fl.agg(accuracy=("final_accuracy", "mean"), pmm=("pmm", "mean")).reset_index()
    df = df.reset_index().merge(fl, on=["case", "defense", "strength"], how="left")
    return df.reindex(columns=TRADEOFF_COLUMNS).reset_index(drop=True)


def evalnet_table(evalnet_files: list[Path]) -> pd.DataFrame:
    """Evaluation-network prediction per noise ratio, with monotonicity flags."""
    rows = []
    for path in evalnet_files:
        record = load_record(path, ["dataset", "monotonicity"])
        for i, point in enumerate(record["monotonicity"]):
            require(point, ["ratio", "prediction"], path, where=f" in monotonicity[{i}]")
            rows.append({"dataset": record["dataset"], **point})
    df = _frame(rows, ["dataset", "ratio", "prediction"], ["dataset", "ratio"])
    by_dataset = df.groupby("dataset")
    df["increasing"] = (by_dataset["prediction"].diff() > 0) | (by_dataset.cumcount() == 0)
    df["monotonic"] = df.groupby("dataset")["increasing"].transform("all").astype(bool)
    return df[EVALNET_COLUMNS]


def write_tables(
    fl_files: list[Path], attack_files: list[Path], evalnet_files: list[Path], out_dir: Path
) -> dict[str, pd.DataFrame]:
    """Build all tables, write them as ``<out_dir>/<name>.csv`` and return them by name."""
    utility = utility_table(fl_files)
    privacy = privacy_table(attack_files)
    tables = {
        "utility": utility,
        "privacy": privacy,
        "tradeoff": tradeoff_table(utility, privacy),
        "evalnet_monotonicity": evalnet_table(evalnet_files),
    }
    for name, df in tables.items():
        write_csv(df, Path(out_dir) / f"{name}.csv")
    return tables
