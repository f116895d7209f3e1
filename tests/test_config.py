"""Configuration validation: defaults from the schema, one clear line per bad value."""

import pytest
from conftest import REPO

from gradleak import config as cfg
from gradleak.experiment import configuration, plan
from gradleak.settings import Setting


def test_defaults_fill_an_empty_config():
    config = configuration.validate({})
    assert config["fl"]["rounds"] == 200
    assert config["cases"][0]["partition"]["kind"] == "iid"
    assert plan.case_name(config["cases"][0]) == "digits-lenet-iid-k10"
    assert config["defenses"] == {"none": {"strengths": [0], "params": {}}}


@pytest.mark.parametrize("bad, key", [
    ({"fll": {}}, "'fll'"),
    ({"fl": {"roundz": 3}}, "'fl.roundz'"),
    ({"fl": {"rounds": "many"}}, "'fl.rounds'"),
    ({"fl": {"local_lr": float("nan")}}, "'fl.local_lr'"),
    ({"defenses": {"dp_gausian": {"strengths": [0.1]}}}, "'defenses.dp_gausian'"),
    ({"defenses": {"dp": {"defense": "dp_gausian", "strengths": [0.1]}}}, "'defenses.dp.defense'"),
    ({"defenses": {"dp_gaussian": {"strengths": [0.1], "params": {"sigma": 1}}}},
     "'defenses.dp_gaussian.params.sigma'"),
    ({"defenses": {"censor": {"strengths": [2], "params": {"stepp": 1}}}},
     "'defenses.censor.params.stepp'"),
    ({"attacks": {"dgl": {}}}, "'attacks.dgl'"),
    ({"attacks": {"dlg": {"stopper": {"kind": "early"}}}}, "'attacks.dlg.stopper.kind'"),
    ({"attacks": {"eot": {"wraps_params": {"iterations": 0}}}},
     "'attacks.eot.wraps_params.iterations'"),
    ({"defenses": {"dp_gaussian": {"strengths": [-0.1]}}}, "'defenses.dp_gaussian.strengths[0]'"),
    ({"defenses": {"quantization": {"strengths": [0]}}}, "'defenses.quantization.strengths[0]'"),
    ({"attack": {"attacker": {"seeds": [7]}}}, "'attack.attacker.seeds'"),
    ({"attack": {"seeds": [7]}}, "'attack.attacker.seeds'"),  # the old flat key, named anew
])
def test_bad_config_names_the_key_in_one_line(bad, key):
    with pytest.raises(cfg.ConfigError) as err:
        configuration.validate(bad)
    message = str(err.value)
    assert key in message
    assert "\n" not in message


def test_every_shipped_config_is_valid():
    for path in [*sorted((REPO / "config").glob("*.yaml")),
                 *sorted((REPO / "config" / "paper").glob("*.yaml"))]:
        configuration.load(path)


def test_a_label_runs_a_registered_attack_or_defense_under_another_name():
    config = configuration.validate({
        "defenses": {"pruning_weight": {"defense": "pruning", "strengths": [0.5],
                                        "params": {"mode": "weight"}}},
        "attacks": {"idlg": {}, "epafl": {"attack": "idlg", "stopper": {"kind": "hybrid"}}}})
    assert plan.attack_of(config, "epafl") == ("idlg", {
        "iterations": 300, "lr": 1.0, "restarts": 1,
        "stopper": {"kind": "hybrid", "threshold": 1e-5, "patience": 15}})
    assert plan.attack_of(config, "idlg")[1]["stopper"] is None
    assert plan.defense_of(config, Setting.of("pruning_weight", 0.5)) == (
        "pruning", {"mode": "weight", "scope": "layer", "ratio": 0.5})


def test_smoke_merges_its_overrides_before_validation():
    config = configuration.validate({"attacks": {"dlg": {"iterations": 300}}, "scale": "smoke",
                           "smoke_overrides": {"attacks": {"dlg": {"iterations": 2}},
                                               "datasets": {"mnist": {"stand_in": "digits"}}}})
    assert config["attacks"]["dlg"]["iterations"] == 2 and config["attacks"]["dlg"]["lr"] == 1.0
    assert config["datasets"]["mnist"]["stand_in"] == "digits"
    plain = configuration.validate({"attacks": {"dlg": {"iterations": 300}},
                          "smoke_overrides": {"attacks": {"dlg": {"iterations": 2}}}})
    assert plain["attacks"]["dlg"]["iterations"] == 300


def test_a_yaml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("fl: {rounds: 3\n")
    with pytest.raises(cfg.ConfigError, match="broken.yaml is not valid YAML"):
        configuration.load(path)
