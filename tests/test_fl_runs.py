"""Which FL runs the plan trains (``experiment.fl_runs``): an attack at round 0 loads its
undefended reference run's initial model, the same weights as its own run's (real digits,
LeNet, the FL phase itself); a defended run is trained only where something reads it; and
a run shorter than a round some job loads is refused before any work."""

from __future__ import annotations

import pytest
import torch

from gradleak import config as cfg
from gradleak.config import ConfigError
from gradleak.experiment import fl_runs, paths, plan
from gradleak.experiment.configuration import validate
from gradleak.experiment.job import Job
from gradleak.experiment.phases.fl_run import run_fl
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.settings import Setting
from gradleak.utils.io import load_torch

CASE = "digits-lenet-iid-k4"
SOTERIA = Setting("soteria", 0.1)


def configuration(table: dict, rounds: int = 1, attacked_round: int = 0) -> dict:
    """Digits 8x8 on LeNet, 4 clients; one target attacking the undefended and the
    Soteria setting at ``attacked_round`` with the table ``table``."""
    return validate({
        "threads": 1, "device": "cpu",
        "datasets": {"digits": {"channels": 1, "size": 8}},
        "cases": [{"dataset": "digits", "model": "lenet", "partition": {"clients": 4}}],
        "fl": {"seeds": [0], "rounds": rounds, "eval_every": 1, "client_batch_size": 8},
        "defenses": {"none": {"strengths": [0]}, "soteria": {"strengths": [0.1]}},
        "attack": {"victims": {"count": 1}, "protocol": {"round": attacked_round}},
        "attacks": {"inverting_gradients": {"iterations": 2}},
        "targets": {"t": {"title": "t", "select": [{}], "table": table}}})


ATTACK_ONLY = {"rows": ["defense"], "metrics": ["psnr"]}
WITH_PMM = {"rows": ["defense"], "metrics": ["psnr", "pmm"]}


def test_a_round0_attack_loads_the_reference_runs_model_which_equals_its_own(tmp_path):
    config = configuration(WITH_PMM)  # both runs trained: their round-0 models compared
    assert fl_runs.model_setting(config, SOTERIA) == plan.NONE
    prepare_data(config, tmp_path, "digits")
    for setting in (plan.NONE, SOTERIA):
        run_fl(config, tmp_path, CASE, setting, 0)
    own, reference = (load_torch(paths.checkpoint(tmp_path, CASE, s, 0, 0))
                      for s in (SOTERIA, plan.NONE))
    assert own.keys() == reference.keys()
    assert all(torch.equal(own[k], reference[k]) for k in own)
    assert Job(config, tmp_path, CASE, SOTERIA, 0).checkpoint == \
        paths.checkpoint(tmp_path, CASE, plan.NONE, 0, 0)


def test_a_defended_run_is_trained_only_where_its_fl_metrics_or_later_rounds_are_read():
    assert fl_runs.fl_settings(configuration(ATTACK_ONLY)) == [(CASE, plan.NONE)]
    both = [(CASE, plan.NONE), (CASE, SOTERIA)]
    assert fl_runs.fl_settings(configuration(WITH_PMM)) == both
    later = configuration(ATTACK_ONLY, rounds=2, attacked_round=1)  # round 1: its own model
    assert fl_runs.fl_settings(later) == both
    assert Job(later, "r", CASE, SOTERIA, 0).checkpoint == \
        paths.checkpoint("r", CASE, SOTERIA, 0, 1)


def test_a_claim_picking_rows_by_pmm_trains_the_defended_run():
    config = configuration(ATTACK_ONLY)
    config["claims"] = [{"id": "c", "target": "t", "metric": "psnr", "over": {"pmm": 0.9}}]
    assert (CASE, SOTERIA) in fl_runs.fl_settings(config)


def test_a_setting_that_changes_the_data_loads_its_own_runs_model():
    changed = Setting("soteria", 0.1, (("datasets.digits.size", 16),))
    assert fl_runs.model_setting(configuration(ATTACK_ONLY), changed) == changed


def test_an_fl_run_shorter_than_a_round_some_attack_loads_is_refused():
    raw = cfg.read("config/paper/censor.yaml")
    raw["reduced_overrides"]["fl"]["rounds"] = 1  # Table V attacks round 9 of its own runs
    del raw["reduced_overrides"]["left_out"]["later-rounds"]  # Table V's claim
    with pytest.raises(ConfigError, match=r"the FL run of 'none-0' \(.*\) has 'fl.rounds' 1, "
                                          r"but every FL run saves the model at round 9"):
        validate({**raw, "scale": "reduced"})
