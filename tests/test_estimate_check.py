"""The cost model against a finished run (benchmarks/estimate_check.py), the calibration's
CPU seconds, the start-up kinds and figures of `gradleak estimate`'s jobs."""

from __future__ import annotations

import importlib.util
import json
import time
from collections import Counter

import pytest
from conftest import REPO

from gradleak import config as cfg
from gradleak.experiment import configuration, estimate, phases, pipeline, plan
from gradleak.utils.io import write_json, write_text

TEST = REPO / "config" / "test.yaml"
# the phases whose jobs call torch.func (the attack engine, GIML, per-sample gradients)
GRADIENT_RULES = {"attack", "train_giml", "train_zoo", "fit_adversaries", "attribute"}
spec = importlib.util.spec_from_file_location("estimate_check",
                                              REPO / "benchmarks" / "estimate_check.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_the_check_sums_each_rule_s_benchmarks_beside_its_estimate(tmp_path, monkeypatch):
    config = configuration.load(TEST)
    results = tmp_path / "results"
    write_json(results / "config.resolved.json", config)
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for rule, name, wall, cpu in [("fl_run", "a/none-0/seed0", 6.0, 4.0),
                                  ("fl_run", "a/dp/seed0", 10.0, 8.0),
                                  ("attack", "a/none-0/seed0", 30.0, 20.0)]:
        write_text(results / "benchmarks" / rule / f"{name}.tsv",
                   header + f"{wall}\t0:00:{int(wall):02d}\t1\t1\t1\t1\t0\t0\t50\t{cpu}\n")
    monkeypatch.setattr(estimate, "calibrate",
                        lambda units, device="cpu", threads=None: dict.fromkeys(units, 1.0))
    table = check.compare(tmp_path)
    jobs = Counter(job.rule for job in estimate.jobs(config, results).values())
    assert table.loc["fl_run", "jobs"] == 2 and table.loc["fl_run", "jobs_est"] == jobs["fl_run"]
    assert table.loc["fl_run", ["wall", "cpu"]].tolist() == [16.0, 12.0]
    assert table.loc["prepare_data", "jobs"] == 0  # no benchmark file, still estimated
    assert table.loc["total", "wall"] == 46.0 and table.loc["total", "cpu"] == 32.0
    work = sum((job.work for job in estimate.jobs(config, results).values()), Counter())
    assert table.loc["total", "estimate"] == pytest.approx(sum(work.values()))
    assert table.loc["total", "est/cpu"] == pytest.approx(sum(work.values()) / 32.0)
    with pytest.raises(SystemExit, match="no benchmark files"):
        check.measured(tmp_path / "elsewhere")


def test_every_job_pays_its_start_up_and_the_report_jobs_their_figures(tmp_path):
    path = tmp_path / "config.yaml"
    raw = json.loads(json.dumps(cfg.read(TEST)))
    raw["targets"] = {"fig": {"title": "two panels", "select": [{"attacks": ["dlg"]}],
                              "figure": [{"kind": "line", "x": "strength", "y": "ssim"},
                                         {"kind": "line", "x": "strength", "y": "psnr"}]}}
    write_json(path, raw)
    config = configuration.load(path)
    found = estimate.jobs(config, tmp_path / "results")
    for job in found.values():
        startups = [unit for unit in job.work if unit.startswith("startup")]
        expected = ("startup:gradients" if job.rule in GRADIENT_RULES else
                    "startup:figures" if job.rule in ("target", "aggregate") else "startup")
        assert startups == [expected], job
    target = next(job for job in found.values() if job.rule == "target")
    assert plan.targets(config) == ["fig"] and target.work["figure"] == 2
    plain = configuration.load(TEST)  # no targets: the standard figures
    aggregate = next(job for job in estimate.jobs(plain, tmp_path / "results").values()
                     if job.rule == "aggregate")
    figures = [p for p in pipeline.job_outputs(phases.load("aggregate"), plain, tmp_path, {})
               if p.parent.name == "figures"]
    assert aggregate.work["figure"] == len(figures) > 0


def test_cpu_seconds_leave_out_waiting_where_wall_seconds_count_it():
    seconds = estimate._seconds(lambda: time.sleep(0.3), "cpu")
    assert 0 <= seconds < 0.15  # asleep: no CPU spent
    busy = estimate._seconds(lambda: sum(range(3_000_000)), "cpu")
    assert busy > 0
