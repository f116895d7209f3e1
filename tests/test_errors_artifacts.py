"""Corrupted or hostile artifacts (docs/errors.md, "Artifacts"): every load of a `.pt`,
`.npy` or `.json` refuses a truncated file, a file of another case or model and a pickle
payload, naming the file; nothing is executed from a file (`weights_only=True`
everywhere, third-party loaders included)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO

from gradleak import cli, models
from gradleak.utils.io import ArtifactError, load_torch, read_json

CASE = "digits-lenet-iid-k4"
CONFIG = """threads: 1
datasets: {digits: {channels: 1, size: 16}}
cases: [{dataset: digits, model: lenet, partition: {clients: 4}}]
fl: {seeds: [0], rounds: 1}
attack: {victims: {count: 1}, outputs: {grid_victims: 1, metrics: [psnr]}}
attacks: {dlg: {iterations: 1}}
"""


class Payload:
    """Unpickling this runs a shell command: what a hostile checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Prepared digits and the undefended FL run's checkpoints, made once."""
    root = tmp_path_factory.mktemp("artifacts")
    (root / "config.yaml").write_text(CONFIG)
    common = ["--config", str(root / "config.yaml"), "--results", str(root / "results")]
    assert cli.main(["prepare-data", *common, "--dataset", "digits"]) == 0
    assert cli.main(["fl-run", *common, "--case", CASE, "--setting", "none-0",
                     "--seed", "0"]) == 0
    return root


def attack_with(trained, tmp_path, damage) -> list[str]:
    results = tmp_path / "results"
    shutil.copytree(trained / "results", results)
    damage(results / "fl" / CASE / "none-0" / "seed0" / "round0.pt")
    return ["attack", "--config", str(trained / "config.yaml"), "--results", str(results),
            "--case", CASE, "--setting", "none-0", "--seed", "0"]


def hostile(marker: Path):
    return lambda path: torch.save({"fc.weight": Payload(marker)}, path)


@pytest.mark.parametrize("damage, expected", [
    (lambda p: p.write_bytes(p.read_bytes()[:700]), ["round0.pt is not a readable torch file",
                                                     "truncated"]),
    (lambda p: p.write_bytes(b""), ["round0.pt is not a readable torch file"]),
    (lambda p: p.write_bytes(b"\x80\x02garbage"), ["round0.pt is not a readable torch file",
                                                   "corrupted"]),
    (lambda p: torch.save(models.build("lenet", 3, 10, 16).state_dict(), p),
     ["round0.pt does not fit case 'digits-lenet-iid-k4'", "size mismatch"]),
    (lambda p: torch.save(models.build("resnet10", 1, 10, 16).state_dict(), p),
     ["round0.pt does not fit case", "another model"]),
    (lambda p: torch.save([1, 2, 3], p), ["round0.pt does not fit case", "dict-like"]),
    ("hostile", ["refused to load", "round0.pt", "GLOBAL", "weights_only=True"]),
], ids=["truncated", "empty", "garbage", "other_case", "other_model", "not_a_state_dict",
        "pickle_payload"])
def test_attack_refuses_a_bad_checkpoint_naming_it(trained, tmp_path, capsys, damage, expected):
    marker = tmp_path / "executed"
    argv = attack_with(trained, tmp_path, hostile(marker) if damage == "hostile" else damage)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(part in lines[0] for part in expected), lines[0]
    assert not marker.exists(), "code from the checkpoint ran"
    assert not (tmp_path / "results" / "attacks").exists()


def generator_file(tmp_path, payload) -> Path:
    path = tmp_path / "gan" / "digits.pt"
    path.parent.mkdir(parents=True)
    torch.save(payload, path)
    return path


@pytest.mark.parametrize("payload, expected", [
    ({"generator": {}, "latent_dim": 16}, ["is not a saved generator", "'channels'"]),
    (models.Generator(16, 1, 8).state_dict(), ["is not a saved generator"]),
    ({"generator": models.Generator(16, 1, 8).state_dict(), "latent_dim": 16, "channels": 1,
      "width": 16}, ["does not fit the generator", "size mismatch"]),
], ids=["missing_keys", "bare_state_dict", "other_width"])
def test_generator_loader_names_the_file(tmp_path, payload, expected):
    path = generator_file(tmp_path, payload)
    with pytest.raises(ArtifactError) as err:
        models.dcgan.load_generator(path)
    assert str(path) in str(err.value) and all(part in str(err.value) for part in expected)


def test_generator_loader_runs_nothing_from_a_hostile_file(tmp_path):
    marker = tmp_path / "executed"
    path = generator_file(tmp_path, {"generator": Payload(marker), "latent_dim": 16,
                                     "channels": 1, "width": 8})
    with pytest.raises(ArtifactError, match="refused to load .*digits.pt"):
        models.dcgan.load_generator(path)
    assert not marker.exists()


def evalnet_files(tmp_path, weights, meta: str) -> Path:
    path = tmp_path / "evalnet" / "digits.pt"
    path.parent.mkdir(parents=True)
    torch.save(weights, path)
    path.with_suffix(".json").write_text(meta)
    return path


GOOD_META = json.dumps({"input_shape": [1, 16, 16], "widths": [8, 16, 32]})


@pytest.mark.parametrize("make, expected", [
    (lambda t: evalnet_files(t, models.evalnet.EvaluationNetwork(1, 16, (8, 16, 32))
                             .state_dict(), GOOD_META[:20]),
     ["digits.json is not valid JSON", "truncated"]),
    (lambda t: evalnet_files(t, models.evalnet.EvaluationNetwork(1, 16, (8, 16, 32))
                             .state_dict(), '{"widths": [8, 16, 32]}'),
     ["digits.json is not an evaluation network's description", "input_shape"]),
    (lambda t: evalnet_files(t, models.evalnet.EvaluationNetwork(1, 16, (4, 8, 16))
                             .state_dict(), GOOD_META),
     ["digits.pt does not fit the evaluation network"]),
], ids=["json_truncated", "json_of_something_else", "weights_of_other_widths"])
def test_evalnet_loader_names_the_file(tmp_path, make, expected):
    make(tmp_path)
    with pytest.raises(ArtifactError) as err:
        models.evalnet.load_evaluation_network(tmp_path / "evalnet" / "digits.pt")
    assert all(part in str(err.value) for part in expected), str(err.value)


def test_an_object_array_in_prepared_data_is_refused(trained, tmp_path, capsys):
    """A `.npy` holding pickled objects (its manifest hash updated to match) is not loaded."""
    results = tmp_path / "results"
    shutil.copytree(trained / "results", results)
    folder = results / "data" / "digits"
    np.save(folder / "train_y.npy", np.array([Payload(tmp_path / "executed")], dtype=object),
            allow_pickle=True)
    manifest = read_json(folder / "manifest.json")
    manifest["splits"]["train"]["y_sha256"] = hashlib.sha256(
        (folder / "train_y.npy").read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["fl-run", "--config", str(trained / "config.yaml"), "--results",
                     str(results), "--case", CASE, "--setting", "none-0", "--seed", "0"]) == 2
    line = capsys.readouterr().err.strip()
    assert "train_y.npy is not a readable .npy array" in line and "allow_pickle" in line
    assert not (tmp_path / "executed").exists()


def test_a_truncated_metrics_file_is_named_by_the_aggregate(trained, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(trained / "results", results)
    metrics = results / "fl" / CASE / "none-0" / "seed0" / "metrics.json"
    metrics.write_text(metrics.read_text()[:50])
    config = tmp_path / "fl_only.yaml"
    config.write_text(CONFIG.replace("attacks: {dlg: {iterations: 1}}", ""))
    assert cli.main(["aggregate", "--config", str(config), "--results", str(results)]) == 2
    line = capsys.readouterr().err.strip()
    assert f"{metrics}: invalid JSON" in line and "\n" not in line


def test_lpips_loads_its_backbone_without_running_a_hostile_hub_file(tmp_path, monkeypatch):
    """lpips would load the AlexNet backbone through torchvision's hub loader, which
    unpickles with weights_only=False; gradleak loads it itself with weights_only=True."""
    from gradleak.metrics import image

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    image._lpips_model.cache_clear()
    marker = tmp_path / "executed"
    backbone = image.lpips_backbone_path()
    backbone.parent.mkdir(parents=True)
    torch.save({"features.0.weight": Payload(marker)}, backbone)
    try:
        with pytest.raises(ArtifactError, match="refused to load .*alexnet"):
            image.lpips(torch.rand(1, 1, 16, 16), torch.rand(1, 1, 16, 16))
    finally:
        image._lpips_model.cache_clear()
    assert not marker.exists()


def test_load_torch_keeps_good_files_and_names_missing_ones(trained, tmp_path):
    state = load_torch(trained / "results" / "fl" / CASE / "none-0" / "seed0" / "round0.pt")
    assert isinstance(state, dict) and "fc.weight" in state
    with pytest.raises(FileNotFoundError, match="checkpoint not found: .*nope.pt"):
        load_torch(tmp_path / "nope.pt")


def test_every_torch_load_in_the_package_passes_weights_only_true():
    """No call of torch.load without weights_only=True, and no torch.hub state-dict loader
    (which defaults to weights_only=False)."""
    offenders = []
    for path in sorted((REPO / "src" / "gradleak").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name.endswith("load_state_dict_from_url") or name.endswith("get_state_dict"):
                offenders.append(f"{path.name}:{node.lineno} {name}")
            if name == "torch.load":
                flags = {k.arg: ast.unparse(k.value) for k in node.keywords}
                if flags.get("weights_only") != "True":
                    offenders.append(f"{path.name}:{node.lineno} torch.load without "
                                     f"weights_only=True")
    assert offenders == []
