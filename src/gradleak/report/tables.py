"""Collect pipeline metrics JSON files into deterministic CSV tables."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gradleak.metrics.maintenance import pmm
from gradleak.report.intervals import interval
from gradleak.report.matched_utility import matched_utility
from gradleak.report.protocol_ranking import protocol_ranking
from gradleak.settings import (
    ATTACK_ONLY_KEYS,
    PAPER,
    PROTOCOL_KEYS,
    Setting,
    is_ablation,
    label_without,
    protocol_of,
)
from gradleak.utils.io import atomic_path

IMAGE_METRICS = ["psnr", "ssim", "mse", "lpips", "stlpips", "noise_ratio"]
# psnr_flat: a uniform image in the training data's mean colour (decision 0111)
VICTIM_METRICS = [*IMAGE_METRICS, "psnr_flat", "iterations", "evaluations"]
# the best image of a victim's batch by each image metric (GIAS Fig. 4's best-in-batch
# PSNR): ``<metric>_best`` from the per-image values (the batch mean for B = 1)
BEST_IN_BATCH = {"psnr": np.max, "ssim": np.max, "mse": np.min, "lpips": np.min, "stlpips": np.min}
# `failure`: why a run's or victim's numbers are missing or not a reconstruction's (NaN/inf
# weights, uploads or pixels); such NaNs are never averaged: means skip them, `failed` counts
UTILITY_COLUMNS = ["case", "defense", "strength", "seed", "final_accuracy", "test_loss",
                   "fallback_rate", "pmm", "failure"]
# `attacker`: `paper`, or `adaptive` (attack.attacker.adaptive: EOT through the defense,
# decision 0072)
PRIVACY_COLUMNS = [
    "case", "defense", "strength", "attack", "attacker", "seed", "victim", "label_correct",
    *VICTIM_METRICS, "fallback", "stop_reason", "failure",
]
TRADEOFF_KEYS = ["case", "defense", "strength", "attack", "attacker"]
TRADEOFF_COLUMNS = [
    *TRADEOFF_KEYS, "accuracy", "pmm", *VICTIM_METRICS, "iterations_max", "iterations_min",
    "iterations_sd", "success_rate", "label_accuracy", "fallback_rate", "victims", "diverged",
    "failed",
]
# 95 % bootstrap intervals (report.intervals): over victims (and seeds) for the victims'
# metrics and the success rate, over FL seeds for PMM (NaN with one seed)
INTERVAL_METRICS = [*IMAGE_METRICS, "success_rate", "pmm"]
TRADEOFF_COLUMNS += [f"{m}_{side}" for m in INTERVAL_METRICS for side in ("low", "high")]
TIMING_COLUMNS = [*TRADEOFF_KEYS, "victims", "wall_time_mean", "wall_time_max", "wall_time_sum"]
EVALNET_COLUMNS = ["dataset", "ratio", "prediction", "error", "increasing", "monotonic",
                   "max_error"]
FL_KEYS = ["case", "setting", "defense", "strength", "seed", "history", "final_accuracy"]
ATTACK_KEYS = ["case", "setting", "defense", "strength", "seed", "runs"]
VICTIM_KEYS = ["victim", "label", "predicted_label", "iterations", "wall_time", "stop_reason"]
# per victim, where its victims are of one class (attack.victims.class, CENSOR Fig. 3)
LIKENESS = ("pairwise_ssim", "truth_pairwise_ssim")
SUCCESS_SSIM = 0.9  # EPAFL §5.2: a reconstruction succeeds when its SSIM is above 0.9


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
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run the step that writes it first "
                                f"(snakemake runs every step in order)")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: invalid JSON ({err}); delete it and re-run the step that "
                         f"writes it") from None
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


def fl_rows(path: Path) -> dict:
    """One FL run's summary: its keys, final accuracy and final test loss."""
    run = load_record(path, FL_KEYS)
    return {**{k: run[k] for k in ("case", "setting", "defense", "strength", "seed")},
            "final_accuracy": run["final_accuracy"],
            "test_loss": run["history"][-1].get("test_loss", np.nan),
            "fallback_rate": run.get("fallback_rate", 0.0), "failure": run.get("failure")}


def utility_table(fl_files: list[Path]) -> pd.DataFrame:
    """One row per FL run, with PMM relative to the undefended run of the same case, seed
    and FL protocol (``Setting.reference``: its ``fl.`` overrides; none where that run is
    not among ``fl_files``)."""
    df = _frame([fl_rows(f) for f in fl_files],
                [*(c for c in UTILITY_COLUMNS if c != "pmm"), "setting"],
                ["case", "defense", "strength", "seed"])
    df["reference"] = [Setting.parse(s).reference.text for s in df["setting"]]
    base = df.loc[df["setting"] == df["reference"], ["case", "seed", "reference",
                                                     "final_accuracy"]]
    df = df.merge(base.rename(columns={"final_accuracy": "base"}),
                  on=["case", "seed", "reference"], how="left")
    df["pmm"] = pmm(df["final_accuracy"], df["base"])
    return df[UTILITY_COLUMNS]


def victim_rows(path: Path) -> list[dict]:
    """One row per (attack, victim) of an attack job's metrics file (with ``layer_errors``,
    a list, where the victim's record has them)."""
    job = load_record(path, ATTACK_KEYS)
    rows = []
    for label, run in sorted(job["runs"].items()):
        require(run, ["victims"], path, where=f" in runs[{label!r}]")
        for i, victim in enumerate(run["victims"]):
            v = require(victim, VICTIM_KEYS, path, where=f" in runs[{label!r}].victims[{i}]")
            rows.append({
                **{k: job[k] for k in ("case", "setting", "defense", "strength", "seed")},
                "attack": label, "final_loss": v.get("final_loss"),
                # metrics written before the adaptive attacker (decision 0072) carry no
                # attacker: the paper's attack
                "attacker": v.get("attacker", PAPER),
                **{k: np.nan if v.get(k) is None else v[k]
                   for k in ["victim", *VICTIM_METRICS, "wall_time", "stop_reason"]},
                "fallback": bool(v.get("fallback", False)), "failure": v.get("failure"),
                # what the defense reported about the upload (Refiner: robust_mse)
                **v.get("upload_report", {}),
                "label_correct": v["predicted_label"] == v["label"],
                **{f"{m}_best": float(best(v.get(f"{m}_per_image", [v[m]])))
                   for m, best in BEST_IN_BATCH.items() if m in v},
                # victims of one class (CENSOR Fig. 3): how alike the reconstructions are
                **{k: v[k] for k in LIKENESS if k in v},
                # R-GAP's error per layer, input layer first (the `layers` figure)
                **({"layer_errors": v["layer_errors"]} if "layer_errors" in v else {}),
            })
    return rows


def privacy_table(attack_files: list[Path]) -> pd.DataFrame:
    """One row per (attack job, attack, victim); the measured wall time apart (``timing``)."""
    rows = [row for path in attack_files for row in victim_rows(path)]
    return _frame(rows, [*PRIVACY_COLUMNS, "wall_time"], [*TRADEOFF_KEYS, "seed", "victim"])


def timing_table(privacy: pd.DataFrame) -> pd.DataFrame:
    """Wall time per (case, defense, strength, attack): a measurement, so unlike every other
    table it differs from run to run."""
    grouped = privacy.groupby(TRADEOFF_KEYS)["wall_time"]
    df = pd.DataFrame({"victims": grouped.size(), "wall_time_mean": grouped.mean(),
                       "wall_time_max": grouped.max(), "wall_time_sum": grouped.sum()})
    return df.reset_index().reindex(columns=TIMING_COLUMNS)


def tradeoff_table(utility: pd.DataFrame, privacy: pd.DataFrame) -> pd.DataFrame:
    """Aggregate privacy per (case, defense, strength, attack) and join mean FL utility."""
    attack = privacy.assign(success=privacy["ssim"] > SUCCESS_SSIM).groupby(TRADEOFF_KEYS)
    df = attack[VICTIM_METRICS].mean()
    df["iterations_max"] = attack["iterations"].max()
    df["iterations_min"] = attack["iterations"].min()
    df["iterations_sd"] = attack["iterations"].std(ddof=0)
    df["success_rate"] = attack["success"].mean()
    df["label_accuracy"] = attack["label_correct"].mean()
    df["fallback_rate"] = attack["fallback"].mean()
    df["victims"] = attack.size()
    df["diverged"] = attack["stop_reason"].agg(lambda r: int((r == "diverged").sum()))
    df["failed"] = attack["failure"].agg(lambda f: int(f.notna().sum()))
    for metric in IMAGE_METRICS:
        df[f"{metric}_low"], df[f"{metric}_high"] = _intervals(attack, metric)
    df["success_rate_low"], df["success_rate_high"] = _intervals(attack, "success")
    fl = utility.groupby(["case", "defense", "strength"])
    fl = fl.agg(accuracy=("final_accuracy", "mean"), pmm=("pmm", "mean"),
                pmm_low=("pmm", lambda v: interval(v)[0]),
                pmm_high=("pmm", lambda v: interval(v)[1])).reset_index()
    df = df.reset_index()
    # the FL run of an attack setting: its label without the attack-only overrides
    df["fl_defense"] = df["defense"].map(lambda label: label_without(label, ATTACK_ONLY_KEYS))
    df = df.merge(fl.rename(columns={"defense": "fl_defense"}),
                  on=["case", "fl_defense", "strength"], how="left")
    return df.reindex(columns=TRADEOFF_COLUMNS).reset_index(drop=True)


def _intervals(groups, column: str) -> tuple[list[float], list[float]]:
    """The 95 % interval of ``column``'s mean per group, over victims and seeds."""
    statistic = "asr" if column == "success" else "mean"
    pairs = [interval(g[column].astype(float), g["seed"], statistic) for _, g in groups]
    return [low for low, _ in pairs], [high for _, high in pairs]


def evalnet_table(evalnet_files: list[Path]) -> pd.DataFrame:
    """Evaluation-network prediction per noise ratio, its error (|prediction - ratio|), the
    stated error it may have (``evalnet.max_error``) and monotonicity flags."""
    rows = []
    for path in evalnet_files:
        record = load_record(path, ["dataset", "monotonicity", "max_error"])
        for i, point in enumerate(record["monotonicity"]):
            require(point, ["ratio", "prediction"], path, where=f" in monotonicity[{i}]")
            rows.append({"dataset": record["dataset"], "max_error": record["max_error"],
                         **point})
    df = _frame(rows, ["dataset", "ratio", "prediction", "max_error"], ["dataset", "ratio"])
    df["error"] = (df["prediction"] - df["ratio"]).abs()
    by_dataset = df.groupby("dataset")
    df["increasing"] = (by_dataset["prediction"].diff() > 0) | (by_dataset.cumcount() == 0)
    df["monotonic"] = df.groupby("dataset")["increasing"].transform("all").astype(bool)
    return df[EVALNET_COLUMNS]


# CENSOR Table I: MSE, LPIPS (and ST-LPIPS, offline) up; PSNR, SSIM down
CENSOR_METRICS = ["mse", "lpips", "stlpips", "psnr", "ssim"]


def censor_table(tradeoff: pd.DataFrame, utility: pd.DataFrame) -> pd.DataFrame:
    """CENSOR Table I layout: one row per defense setting of each protocol (its ``fl.`` and
    ``attack.protocol.`` overrides, ``protocols:``; empty: as configured) with its FL run's
    accuracy and fallback rate (the share of uploads that were the clean gradient), then
    MSE, LPIPS, PSNR and SSIM per attack. A protocol's overrides are no ablation."""
    keys, run = ["case", "protocol", "defense", "strength"], ["case", "fl", "defense", "strength"]

    def split(frame: pd.DataFrame) -> pd.DataFrame:  # its FL run's protocol: fl. alone
        labels = frame["defense"]
        return frame.assign(protocol=labels.map(protocol_of),
                            fl=labels.map(lambda d: protocol_of(d, ("fl.",))),
                            defense=labels.map(lambda d: label_without(d, PROTOCOL_KEYS)))

    main = split(tradeoff)
    main = main[~main["defense"].map(is_ablation, na_action="ignore").astype(bool)
                & (main["attacker"] == PAPER)]  # Table I: the paper's attacks
    if main.empty:
        return pd.DataFrame(columns=[*keys, "accuracy", "fallback_rate"])
    wide = main.pivot_table(index=[*keys, "fl"], columns="attack", values=CENSOR_METRICS)
    wide = wide.reorder_levels([1, 0], axis=1)
    attacks = sorted(main["attack"].unique())
    wide = wide.reindex(columns=[(a, m) for a in attacks for m in CENSOR_METRICS])
    wide.columns = [f"{a}_{m}" for a, m in wide.columns]
    fl = split(utility).groupby(run, as_index=False).agg(
        accuracy=("final_accuracy", "mean"), fallback_rate=("fallback_rate", "mean"))
    wide = wide.reset_index().merge(fl, on=run, how="left")
    columns = [*keys, "accuracy", "fallback_rate", *(f"{a}_{m}" for a in attacks
                                                     for m in CENSOR_METRICS)]
    return wide[columns].sort_values(keys, kind="stable", ignore_index=True)


def write_tables(fl_files: list[Path], attack_files: list[Path], evalnet_files: list[Path],
                 out_dir: Path, names: list[str] | None = None,
                 stronger: dict[str, str] | None = None,
                 protocols: Mapping[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """Build the tables ``names`` (default: all), write them as ``<out_dir>/<name>.csv`` and
    return every table built, by name. ``stronger``: each defense label's direction
    (``matched_utility.defense_directions``) for the matched-utility curves. ``protocols``:
    each protocol's overrides (``fl.local_steps=5``; empty: as configured) -> its name in
    the configuration, which the tables' ``protocol`` column then holds, the ranking's
    protocols in this order."""
    utility = utility_table(fl_files)
    privacy = privacy_table(attack_files)
    tradeoff = tradeoff_table(utility, privacy)
    matched = matched_utility(tradeoff, stronger)
    censor = censor_table(tradeoff, utility)
    if protocols:
        for table in (matched, censor):
            table["protocol"] = table["protocol"].map(lambda p: protocols.get(p, p))
    tables = {"utility": utility, "privacy": privacy[PRIVACY_COLUMNS], "tradeoff": tradeoff,
              "timing": timing_table(privacy), "censor_table": censor,
              "matched_utility": matched,
              "protocol_ranking": protocol_ranking(matched, list((protocols or {}).values())),
              "evalnet_monotonicity": evalnet_table(evalnet_files)}
    names = list(tables) if names is None else names
    for name in names:
        write_csv(tables[name], Path(out_dir) / f"{name}.csv")
    return {name: tables[name] for name in names}
