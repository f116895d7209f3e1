"""Configuration validation: defaults from the schema, one clear line per bad value."""

import re

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


def test_the_papers_numbers_in_a_csv_beside_the_config_read_as_if_written_inline(tmp_path):
    """``reference.<target>.file``: the header is the columns, each line a row; numbers,
    empty cells (null) and mappings in YAML flow style (a bound, a reduction from a
    baseline) read as the inline form reads them; an unreadable file is one line."""
    (tmp_path / "paper").mkdir()
    (tmp_path / "paper" / "tab1.csv").write_text(
        "strength, defense, accuracy\n0.01,dp_gaussian,0.5133\n0,none,\n"
        '1.0e-3,pruning,"{reduction: 0.06, from: {defense: none, strength: 0}}"\n'
        "0.1,pruning,{'>': 0.6}\n")
    (tmp_path / "paper.yaml").write_text(
        "reference:\n  tab1: {source: 'Table 1', file: paper/tab1.csv}\n")
    assert cfg.read(tmp_path / "paper.yaml")["reference"]["tab1"] == {
        "source": "Table 1", "columns": ["strength", "defense", "accuracy"],
        "rows": [[0.01, "dp_gaussian", 0.5133], [0, "none", None],
                 [0.001, "pruning", {"reduction": 0.06, "from": {"defense": "none",
                                                                "strength": 0}}],
                 [0.1, "pruning", {">": 0.6}]]}
    (tmp_path / "paper.yaml").write_text("reference:\n  tab1: {source: x, file: gone.csv}\n")
    with pytest.raises(cfg.ConfigError, match=r"^invalid config: 'reference.tab1.file': "
                       r".*gone\.csv cannot be read as the paper's numbers \(No such file"):
        cfg.read(tmp_path / "paper.yaml")


@pytest.mark.parametrize("paper", sorted(p.stem for p in (REPO / "config" / "paper").glob(
    "*.yaml")))
def test_every_papers_numbers_are_csv_files_beside_its_config(paper):
    """Each paper config keeps its printed numbers in config/paper/<paper>/<target>.csv,
    one per ``reference`` entry, and no file there is left unread."""
    text = (REPO / "config" / "paper" / f"{paper}.yaml").read_text()
    named = set(re.findall(rf"^    file: ({paper}/[a-z0-9_]+\.csv)$", text, flags=re.M))
    kept = {f"{paper}/{p.name}" for p in (REPO / "config" / "paper" / paper).glob("*.csv")}
    entries = cfg.read(REPO / "config" / "paper" / f"{paper}.yaml")["reference"]
    assert named == kept and len(named) == len(entries) > 0
