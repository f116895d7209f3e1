"""The runs a target reads, as the frames of ``report.target_data.TargetInputs``: every point of
its selections (case x setting x attacks x seeds) with its series and swept values, and the
attribute jobs of its points (RecUP-FL) where the plan has them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gradleak.experiment import fl_runs, paths, plan
from gradleak.experiment.studies import registry as studies
from gradleak.metrics.maintenance import pmm
from gradleak.report.tables import fl_rows, load_record, victim_rows
from gradleak.report.target_data import TargetInputs
from gradleak.settings import PAPER, Setting


def _keys(config: dict, point: plan.Point, seed: int) -> dict:
    return {**plan.point_keys(config, point), "seed": seed}


def _fl_summary(results: Path, case: str, setting: Setting, seed: int, trained: set) -> dict:
    """Final accuracy, test loss, PMM (against the undefended run under the same FL
    protocol, ``Setting.reference``, when it was run) and the share of uploads that were
    the clean gradient; NaN where the plan trains no run of the setting (not in
    ``trained``, ``fl_runs.fl_settings``)."""
    path = paths.fl_metrics(results, case, plan.fl_setting(setting), seed)
    if (case, plan.fl_setting(setting)) not in trained or not path.is_file():
        return {"accuracy": np.nan, "test_loss": np.nan, "pmm": np.nan, "fallback_rate": np.nan}
    run = fl_rows(path)
    base = paths.fl_metrics(results, case, setting.reference, seed)
    reference = fl_rows(base)["final_accuracy"] if base.is_file() else np.nan
    return {"accuracy": run["final_accuracy"], "test_loss": run["test_loss"],
            "fallback_rate": run["fallback_rate"],
            "pmm": float(pmm(run["final_accuracy"], reference)) if base.is_file() else np.nan}


def _attribute_rows(path: Path, keys: dict) -> list[dict]:
    """One attribute job's rows (adversary, attacker, attribute, round), each with its ASR,
    chance, the test uploads it was measured on, the FL run's learning loss and accuracy, and
    the point's keys."""
    job = load_record(path, ["rows", "learning_loss", "accuracy"])
    return [{**keys, "adversary": row["adversary"], "attacker": row.get("attacker", PAPER),
             "attribute": row["attribute"],
             "round": row["round"], "attribute_asr": row["asr"], "chance": row["chance"],
             "uploads": row.get("uploads", np.nan),  # jobs before the count carry none
             "learning_loss": job["learning_loss"], "accuracy": job["accuracy"]}
            for row in job["rows"]]


def target_inputs(config: dict, results: Path, name: str) -> TargetInputs:
    if name in plan.studies(config):
        measured = studies.load(results, name)
        return TargetInputs(*(pd.DataFrame() for _ in range(4)), study=pd.DataFrame(
            measured.rows), arrays=measured.arrays)
    victims, fl, history, details, attribute = [], [], [], [], []
    attributed, trained = set(plan.attribute_jobs(config)), set(fl_runs.fl_settings(config))
    for point in (p for p in plan.points(config) if p.target == name):
        setting = plan.fl_setting(point.setting)
        if (point.case, setting) in attributed:
            for seed in config["fl"]["seeds"]:
                attribute += _attribute_rows(
                    paths.attribute_metrics(results, point.case, setting, seed),
                    _keys(config, point, seed))
        for seed in config["fl"]["seeds"] if (point.case, setting) in trained else ():
            keys = _keys(config, point, seed)
            summary = _fl_summary(results, point.case, point.setting, seed, trained)
            fl.append({**keys, **summary})
            record = load_record(paths.fl_metrics(results, point.case,
                                                  plan.fl_setting(point.setting), seed),
                                 ["history"])
            history += [{**keys, **entry} for entry in record["history"]]
        for seed in config["attack"]["attacker"]["seeds"]:
            if not point.attacks:
                continue
            keys = _keys(config, point, seed)
            summary = _fl_summary(results, point.case, point.setting, seed, trained)
            path = paths.attack_metrics(results, point.case, point.setting, seed)
            snapshots = load_record(path, ["snapshots"])["snapshots"]
            # a target reproduces the paper's attacks, not the adaptive attacker's rows
            victims += [{**row, **keys, **summary} for row in victim_rows(path)
                        if row["attack"] in point.attacks and row["attacker"] == "paper"]
            details += [{**keys, "attack": label, "snapshots": snapshots,
                         "details": str(paths.attack_details(results, point.case, point.setting,
                                                             seed))}
                        for label in point.attacks]
    return TargetInputs(pd.DataFrame(victims), pd.DataFrame(fl), pd.DataFrame(history),
                        pd.DataFrame(details), pd.DataFrame(attribute))
