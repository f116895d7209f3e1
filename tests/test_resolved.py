"""A run's resolved configuration is read without validating it again when its bytes are
the ones the Snakefile validated (experiment.resolved), so a target job imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

from gradleak import config as cfg
from gradleak.experiment import configuration, resolved


def _resolved(tmp_path, path="config/paper/epafl.yaml", scale="smoke"):
    config = configuration.validate({**cfg.read(REPO / path), "scale": scale})
    out = tmp_path / "config.resolved.json"
    out.write_text(json.dumps(config, sort_keys=True, indent=2, allow_nan=True) + "\n")
    return out, config


def test_the_validated_bytes_are_read_as_they_are_and_any_other_file_is_validated(
        tmp_path, monkeypatch):
    path, config = _resolved(tmp_path)
    monkeypatch.delenv(resolved.VALIDATED, raising=False)
    resolved.export(path)
    def validated_again(path):
        raise AssertionError(f"{path} validated again")

    monkeypatch.setattr(configuration, "load", validated_again)
    assert resolved.load(path) == config
    edited = json.loads(path.read_text())
    edited["fl"]["rounds"] = -1
    path.write_text(json.dumps(edited))  # edited since: validated, and refused
    monkeypatch.undo()
    monkeypatch.setenv(resolved.VALIDATED, "0" * 64)
    try:
        resolved.load(path)
    except cfg.ConfigError as err:
        assert "rounds" in str(err)
    else:
        raise AssertionError("an edited file was not validated")


def test_a_target_job_imports_no_torch(tmp_path):
    path, _ = _resolved(tmp_path)
    script = ("import sys\nfrom gradleak.experiment import resolved\n"
              f"resolved.export({str(path)!r})\nfrom gradleak.cli import main\n"
              f"main(['target', '--config', {str(path)!r}, '--results', "
              f"{str(tmp_path / 'results')!r}, '--name', 'fig1'])\n"
              "print(sorted(m for m in ('torch', 'sklearn', 'lpips') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "fl/" in run.stderr and "not found" in run.stderr, run.stderr  # it got to its inputs
    assert run.stdout.strip() == "[]", run.stdout
