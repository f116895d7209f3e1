import pytest

from fedleak import config as cfg


def test_defaults_fill_an_empty_config():
    config = cfg.validate({})
    assert config["fl"]["rounds"] == 200
    assert config["cases"][0]["partition"]["kind"] == "iid"
    assert cfg.case_name(config["cases"][0]) == "digits-lenet-iid-k10"


@pytest.mark.parametrize("bad, key", [
    ({"fll": {}}, "'fll'"),
    ({"fl": {"roundz": 3}}, "'fl.roundz'"),
    ({"fl": {"rounds": "many"}}, "'fl.rounds'"),
    ({"defenses": {"dp_gausian": {"strengths": [0.1]}}}, "'defenses.dp_gausian'"),
    ({"attacks": {"dgl": {}}}, "'attacks.dgl'"),
    ({"defenses": {"dp_gaussian": {"strengths": [-0.1]}}}, "'defenses.dp_gaussian.strengths[0]'"),
    ({"defenses": {"quantization": {"strengths": [0]}}}, "'defenses.quantization.strengths[0]'"),
    ({"attack": {"seeds": [7]}}, "'attack.seeds'"),
])
def test_bad_config_names_the_key_in_one_line(bad, key):
    with pytest.raises(cfg.ConfigError) as err:
        cfg.validate(bad)
    message = str(err.value)
    assert key in message
    assert "\n" not in message


def test_embedded_and_test_configs_are_valid():
    from conftest import REPO

    for name in ("config.yaml", "test.yaml"):
        cfg.load(REPO / "config" / name)
    for path in sorted((REPO / "config" / "paper").glob("*.yaml")):
        cfg.load(path)


def test_strength_text_is_canonical():
    assert [cfg.fmt_strength(v) for v in (0, 0.01, 1e-5, 4, 0.99)] == \
        ["0", "0.01", "1e-05", "4", "0.99"]


def test_ablation_settings_name_and_parametrise_each_point():
    sweep = {"beta": [0, 2], "iterations": [5]}
    config = cfg.validate({"defenses": {"refiner": {"strengths": [0.1, 0.3]}},
                           "ablations": {"refiner": {"strength": 0.1, "sweep": sweep}}})
    assert list(cfg.ablation_settings(config)) == [
        ("refiner.beta0", "0.1"), ("refiner.beta2", "0.1"), ("refiner.iterations5", "0.1")]
    params = cfg.defense_params(config, "refiner.iterations5")
    assert params["iterations"] == 5 and isinstance(params["iterations"], int)
    assert params["beta"] == 1.0  # the other parameters keep their configured defaults
    assert cfg.split_label("refiner.tau1e-05") == ("refiner", {"tau": 1e-05})
    with pytest.raises(cfg.ConfigError, match="refiner.beta"):
        cfg.split_label("refiner.beta")


def test_ablation_strength_must_be_a_configured_strength():
    with pytest.raises(cfg.ConfigError, match=r"ablations.refiner.strength.*0.5"):
        cfg.validate({"defenses": {"refiner": {"strengths": [0.1]}},
                      "ablations": {"refiner": {"strength": 0.5, "sweep": {"beta": [0]}}}})
