"""Collect pipeline metrics JSON files into deterministic CSV tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from fedleak.metrics.utility import pmm
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
    df["pmm"] = pmm(df["final_accuracy"], df["base"])
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


CENSOR_METRICS = ["mse", "lpips", "psnr", "ssim"]  # CENSOR Table I: MSE, LPIPS up; PSNR, SSIM down


def is_ablation(defense: str) -> bool:
    """Ablation settings carry overrides in their name (``refiner~beta=0.5``, Setting.label)."""
    return "~" in defense


def censor_table(tradeoff: pd.DataFrame) -> pd.DataFrame:
    """CENSOR Table I layout: one row per defense setting, MSE/LPIPS/PSNR/SSIM per attack."""
    main = tradeoff[~tradeoff["defense"].map(is_ablation, na_action="ignore").astype(bool)]
    if main.empty:
        return pd.DataFrame(columns=["case", "defense", "strength"])
    wide = main.pivot_table(index=["case", "defense", "strength"], columns="attack",
                            values=CENSOR_METRICS)
    wide = wide.reorder_levels([1, 0], axis=1)
    attacks = sorted(main["attack"].unique())
    wide = wide.reindex(columns=[(a, m) for a in attacks for m in CENSOR_METRICS])
    wide.columns = [f"{a}_{m}" for a, m in wide.columns]
    return wide.reset_index().sort_values(["case", "defense", "strength"], kind="stable")


def ablation_table(tradeoff: pd.DataFrame, points: list[dict]) -> pd.DataFrame:
    """Refiner Tables 6-9: one row per swept value and attack. ``points`` name each value's
    setting (``label``; the default value's is the main run's) and whether it is the default."""
    rows = []
    for point in points:
        picked = tradeoff[(tradeoff["defense"] == point["label"])
                          & (tradeoff["strength"] == point["strength"])]
        for row in picked.itertuples():
            rows.append({**{k: point[k] for k in ("defense", "param", "value", "default",
                                                  "strength")},
                         "case": row.case, "attack": row.attack, "pmm": row.pmm,
                         "psnr": row.psnr, "ssim": row.ssim, "lpips": row.lpips,
                         "noise_ratio": row.noise_ratio})
    columns = ["defense", "param", "value", "default", "strength", "case", "attack", "pmm",
               "psnr", "ssim", "lpips", "noise_ratio"]
    return pd.DataFrame.from_records(rows, columns=columns)


def write_tables(fl_files: list[Path], attack_files: list[Path], evalnet_files: list[Path],
                 out_dir: Path, ablation_points: list[dict] | None = None
                 ) -> dict[str, pd.DataFrame]:
    """Build all tables, write them as ``<out_dir>/<name>.csv`` and return them by name.

    ``ablation_points`` (``experiment.plan.ablation_points``) add ``ablation.csv``.
    """
    utility = utility_table(fl_files)
    privacy = privacy_table(attack_files)
    tradeoff = tradeoff_table(utility, privacy)
    tables = {
        "utility": utility,
        "privacy": privacy,
        "tradeoff": tradeoff,
        "censor_table": censor_table(tradeoff),
        "evalnet_monotonicity": evalnet_table(evalnet_files),
    }
    if ablation_points:
        tables["ablation"] = ablation_table(tradeoff, ablation_points)
    for name, df in tables.items():
        write_csv(df, Path(out_dir) / f"{name}.csv")
    return tables
