"""Every phase on the configured ``device`` (issue 32): FL runs (with Refiner's evaluation
network and RecUP-FL's model zoo as defenses), the evaluation network, the GAN prior,
GIML's meta-learning, the model zoo, the adversaries' fitting, attribute inference and the
attacks (the paper's and the adaptive attacker, EOT over RecUP-FL's draws too), each on
every device present (the CPU; CUDA where ``torch.cuda.is_available()``).

A global forward pre-hook records the device of every module call (its parameters,
buffers and tensor inputs) while a phase runs; every ``.pt`` file the phase writes must
hold CPU tensors only (read without ``map_location``: a CUDA-trained file loads on a
machine without a GPU). ``device: cuda`` where there is none is refused by every phase
before it writes anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from gradleak.experiment import configuration, paths
from gradleak.experiment.job import model_at
from gradleak.experiment.phases.attack import run_attacks
from gradleak.experiment.phases.attribute import run_attribute
from gradleak.experiment.phases.fit_adversaries import fit_adversaries
from gradleak.experiment.phases.fl_run import run_fl
from gradleak.experiment.phases.prepare_data import prepare_data
from gradleak.experiment.phases.train_evalnet import train_evalnet
from gradleak.experiment.phases.train_gan import train_gan
from gradleak.experiment.phases.train_giml import train_giml
from gradleak.experiment.phases.train_zoo import train_zoo
from gradleak.settings import Setting
from gradleak.utils.device import resolve, select, to_device
from gradleak.utils.io import load_torch

REPO = Path(__file__).resolve().parents[1]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CASE = "digits-lenet-iid-k4"
NONE, REFINER, RECUPFL = (Setting.parse(s) for s in ("none-0", "refiner-0.1", "recupfl-0.01"))


def tiny_config(device: str) -> dict:
    """config/test.yaml cut to what every phase needs once, on ``device``."""
    raw = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    raw.update(device=device, defenses={k: raw["defenses"][k] for k in ("none", "refiner",
                                                                       "recupfl")},
               attacks={"dlg": {"iterations": 2},
                        "inverting_gradients": {"iterations": 2, "restarts": 1},
                        "gias": {"variant": "z/w", "latent_iterations": 2,
                                 "parameter_iterations": 2, "restarts": 1}})
    raw["attack"]["outputs"].update(metrics=["psnr", "mse"])
    raw["attack"]["attacker"].update(adaptive=["inverting_gradients"], adaptive_samples=2)
    raw["attribute"].update(adversaries=["stru_nn"], defenses=["none"])
    return configuration.validate(raw)


# phase name -> its call, in the order the pipeline runs them
PHASES = {
    "fl": lambda c, r: run_fl(c, r, CASE, NONE, 0),
    "evalnet": lambda c, r: train_evalnet(c, r, "digits"),
    "gan": lambda c, r: train_gan(c, r, "digits"),
    "giml": lambda c, r: train_giml(c, r, CASE),
    "zoo": lambda c, r: train_zoo(c, r, CASE, 0, 0),
    "adversaries": lambda c, r: fit_adversaries(c, r, CASE, NONE, 0, 0),
    "attribute": lambda c, r: run_attribute(c, r, CASE, NONE, 0),
    "fl_refiner": lambda c, r: run_fl(c, r, CASE, REFINER, 0),
    "fl_recupfl": lambda c, r: run_fl(c, r, CASE, RECUPFL, 0),
    "attack": lambda c, r: run_attacks(c, r, CASE, NONE, 0),
    "attack_refiner": lambda c, r: run_attacks(c, r, CASE, REFINER, 0),
    # the adaptive attacker's EOT draws of RecUP-FL's perturbation
    "attack_recupfl": lambda c, r: run_attacks(c, r, CASE, RECUPFL, 0),
}
# the phases whose outputs are metrics JSON and images only
WRITE_NO_PT = {"attribute", "attack", "attack_refiner", "attack_recupfl"}


def _devices_of(module: torch.nn.Module, args: tuple) -> set[str]:
    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False),
               *(a for a in args if isinstance(a, torch.Tensor))]
    return {t.device.type for t in tensors}


def _run_recorded(phase, config: dict, results: Path) -> tuple[set[str], int, list[Path]]:
    """Run ``phase``; the device types its module calls touched, how many calls, and the
    ``.pt`` files it wrote."""
    before = set(results.rglob("*.pt"))
    seen: set[str] = set()
    calls = [0]

    def hook(module, args):
        seen.update(_devices_of(module, args))
        calls[0] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        phase(config, results)
    finally:
        handle.remove()
    return seen, calls[0], sorted(set(results.rglob("*.pt")) - before)


@pytest.fixture(scope="module", params=DEVICES)
def ran(request, tmp_path_factory):
    """Every phase run once on the device, in pipeline order: name -> (device types seen,
    module calls, .pt files written); and the configuration and results folder."""
    config = tiny_config(request.param)
    results = tmp_path_factory.mktemp(f"device-{request.param}") / "results"
    for dataset in ("digits", "natural"):
        prepare_data(config, results, dataset)
    records = {name: _run_recorded(phase, config, results) for name, phase in PHASES.items()}
    return request.param, config, results, records


@pytest.mark.slow
@pytest.mark.parametrize("phase", list(PHASES))
def test_every_phase_runs_on_the_configured_device_and_saves_cpu_tensors(ran, phase):
    device, _, _, records = ran
    seen, calls, written = records[phase]
    assert calls > 0, f"{phase} ran no module"
    assert seen == {device}, f"{phase} ran modules on {seen}, configured {device}"
    assert bool(written) == (phase not in WRITE_NO_PT), (phase, written)
    for path in written:
        state = torch.load(path, weights_only=True)  # no map_location: where it was saved
        tensors = [t for t in _leaves(state) if isinstance(t, torch.Tensor)]
        assert tensors and {t.device.type for t in tensors} == {"cpu"}, path


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_a_checkpoint_saved_on_the_device_loads_into_a_cpu_model(ran):
    """The FL run's final model, built on the CPU from its file, predicts as it did."""
    device, config, results, _ = ran
    from gradleak import data
    from gradleak.experiment.job import Job

    job = Job(config, results, CASE, NONE, 0)
    test = data.load_prepared(job.data_dir, "test")
    model = model_at(job, test, job.fl_dir / "final.pt")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    on_device = model_at(job, test, job.fl_dir / "final.pt").to(resolve(device))
    with torch.no_grad():
        here = model.eval()(test.x[:16])
        there = on_device.eval()(test.x[:16].to(resolve(device))).cpu()
    assert torch.allclose(here, there, atol=1e-4)  # float results may differ across devices


@pytest.mark.parametrize("phase", ["fl", "gan"])
def test_the_same_seed_on_the_same_device_gives_the_same_weights(ran, phase, tmp_path):
    """Deterministic kernels: the FL run and the GAN prior again, bit for bit (the files'
    tensors; a .pt file's bytes also hold the name it was written under)."""
    _, config, results, _ = ran
    again = tmp_path / "results"
    prepare_data(config, again, "digits")
    PHASES[phase](config, again)
    file = {"fl": lambda r: paths.fl_dir(r, CASE, NONE, 0) / "final.pt",
            "gan": lambda r: paths.gan_file(r, "digits")}[phase]
    first, second = (list(_leaves(load_torch(file(r)))) for r in (results, again))
    assert len(first) == len(second) > 1
    for a, b in zip(first, second):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The tiny configuration's data prepared, nothing else run."""
    config = tiny_config("cpu")
    results = tmp_path_factory.mktemp("refused") / "results"
    for dataset in ("digits", "natural"):
        prepare_data(config, results, dataset)
    return config, results


@pytest.mark.parametrize("phase", list(PHASES))
def test_device_cuda_without_a_gpu_is_refused_by_every_phase_before_it_writes(
        phase, prepared, monkeypatch):
    """Every phase reads 'device' (this fails for one that ignores it), before its work."""
    config, results = prepared
    config = {**config, "device": "cuda"}
    before = sorted(results.rglob("*"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^device 'cuda' requested but "
                                         r"torch.cuda.is_available\(\) is False; expected"):
        PHASES[phase](config, results)
    assert sorted(results.rglob("*")) == before


def test_to_device_moves_what_is_elsewhere_and_keeps_what_is_there():
    """Values already on the device come back as the very objects (a CPU state dict saves
    the same bytes as before); others are moved, containers and state-dict metadata kept."""
    net = torch.nn.Linear(2, 1)
    state = net.state_dict()
    value = {"a": [state, (torch.ones(2), "s")], "n": 3}
    assert to_device(value, "cpu") is value and to_device(state, "cpu") is state
    moved = to_device(value, "meta")  # a device every machine has
    assert moved["a"][0]["weight"].device.type == "meta" and moved["n"] == 3
    assert type(moved["a"][0]) is type(state) and moved["a"][0]._metadata == state._metadata
    assert isinstance(moved["a"][1], tuple) and moved["a"][1][1] == "s"
    assert state["weight"].device.type == "cpu"  # the original is untouched


def test_select_switches_on_the_deterministic_settings(monkeypatch):
    """torch's Reproducibility notes, set by the call every phase makes first."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    for flag, value in (("deterministic", False), ("benchmark", True), ("allow_tf32", True)):
        monkeypatch.setattr(torch.backends.cudnn, flag, value)
    torch._C._set_deterministic_algorithms(False)
    try:
        assert select("cpu") == torch.device("cpu")
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch._C._set_deterministic_algorithms(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.allow_tf32
