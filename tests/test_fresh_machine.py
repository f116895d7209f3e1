"""A new user's machine: every dependency declared, the README's first command in a clean
virtual environment, and files as readable as a plain ``open()`` makes them."""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, commands, doc_block

import gradleak
from gradleak.utils import io

TINY_RUN = "snakemake --cores all --configfile config/test.yaml"
OPTIONAL = ["cma", "dvc.repo", "lpips", "snakemake", "snakemake_executor_plugin_slurm",
            "sklearn.svm", "stlpips_pytorch.stlpips", "torchvision.models"]
EVERY_IMPORT = ("import importlib, pkgutil, gradleak; "
                "[importlib.import_module(m.name) for m in "
                "pkgutil.walk_packages(gradleak.__path__, 'gradleak.')]; "
                f"[importlib.import_module(m) for m in {OPTIONAL[:4] + OPTIONAL[5:]!r}]; "
                "print('imported')")  # all but the SLURM plugin, the `slurm` extra's


def test_every_module_of_gradleak_imports():
    failed = {}
    for module in pkgutil.walk_packages(gradleak.__path__, "gradleak."):
        try:
            importlib.import_module(module.name)
        except Exception as err:  # noqa: BLE001 (collect every failure, name each)
            failed[module.name] = repr(err)
    assert not failed


@pytest.mark.parametrize("module", OPTIONAL)
def test_every_optional_path_imports(module):
    """Each library gradleak reaches only on some paths, with everything it imports itself
    (ST-LPIPS imports IPython and torchsummary without declaring them)."""
    importlib.import_module(module)


def test_st_lpips_scores_from_the_weights_its_wheel_ships():
    from gradleak import metrics

    truth = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    assert metrics.stlpips(truth, truth) == pytest.approx(0.0, abs=1e-6)
    assert metrics.stlpips(torch.rand(2, 1, 16, 16), truth) > 0.01


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077], ids=["022", "002", "077"])
def test_atomic_writes_end_with_the_permissions_a_plain_open_gives(tmp_path, umask):
    previous = os.umask(umask)
    try:
        (tmp_path / "plain.txt").write_text("x")
        io.write_json(tmp_path / "metrics.json", {"a": 1})
        io.save_torch(tmp_path / "model.pt", {"w": torch.zeros(2)})
    finally:
        os.umask(previous)
    expected = (tmp_path / "plain.txt").stat().st_mode & 0o777
    assert expected == 0o666 & ~umask
    for name in ("metrics.json", "model.pt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == expected, name


def test_a_saved_checkpoint_has_the_same_bytes_wherever_it_is_written(tmp_path):
    state = {"w": torch.arange(5.0)}
    first = io.save_torch(tmp_path / "a" / "round0.pt", state)
    second = io.save_torch(tmp_path / "b" / "final.pt", state)
    assert first.read_bytes() == second.read_bytes()


def test_seeding_switches_torch_to_deterministic_kernels_without_loading_its_compiler():
    code = ("import sys, torch; from gradleak.utils.seeding import seed_everything; "
            "seed_everything(0); print(torch.are_deterministic_algorithms_enabled(), "
            "'torch._inductor' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert proc.stdout.split() == ["True", "False"]


def tracked_files(dest: Path) -> Path:
    """The files a clone of this checkout would hold (tracked or not ignored), copied."""
    listing = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                              "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in filter(None, listing.stdout.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name, follow_symlinks=False)
    return dest


@pytest.mark.slow
@pytest.mark.fresh_venv
@pytest.mark.xdist_group("fresh_venv")
def test_the_readmes_first_command_works_in_a_clean_virtual_environment(tmp_path):
    """``python -m venv`` without system packages, the README's install as written; then
    every module of gradleak and every optional path imports in it, and Snakemake plans the
    tiny configuration (the run itself is tests/test_pipeline.py's, in this environment's
    twin: what a job needs beyond its imports is in the wheel's files, which the install
    brings)."""
    block = doc_block("README.md", "**Run the embedded default**", "bash")
    install, run = commands(block)[0].split(" && ")
    assert install == "pip install -e ." and run == "snakemake --cores all"
    project = tracked_files(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    # pip's byte-compiling of every installed file (torch's thousands) is no part of what
    # the install must show; Python compiles what the commands import
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv),
               DVC_NO_ANALYTICS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_COMPILE="1")
    outputs = []
    for command in (install, f"python -c \"{EVERY_IMPORT}\"", f"{TINY_RUN} -n"):
        proc = subprocess.run(command, shell=True, cwd=project, env=env, capture_output=True,
                              text=True)
        assert proc.returncode == 0, f"{command}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        outputs.append(proc.stdout)
    assert outputs[1].strip() == "imported"
    assert "Job stats" in outputs[2] and "aggregate" in outputs[2]
