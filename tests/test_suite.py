"""The test suite's own machinery: pytest-xdist keeps an ``xdist_group`` on one worker, so a
session fixture that a group shares (``local_run``, ``dvc_run``: minutes each) is built once.
pytest 9.2 names a test by ``_id`` where pytest-xdist 3.8 appends the group to ``_nodeid``,
which ungroups every group silently (pyproject.toml pins pytest below 9.2)."""

from __future__ import annotations

import subprocess
import sys


def test_a_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.parametrize('n', range(6))\n"
        "@pytest.mark.xdist_group('together')\n"
        "def test_grouped(n):\n"
        "    with open(f'grouped{n}', 'w') as out:\n"
        "        out.write(os.environ['PYTEST_XDIST_WORKER'])\n"
        "@pytest.mark.parametrize('n', range(6))\n"
        "def test_free(n):\n"
        "    pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "--basetemp", str(tmp_path / "base"), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    workers = {p.read_text() for p in tmp_path.glob("grouped*")}
    assert len(list(tmp_path.glob("grouped*"))) == 6 and len(workers) == 1, workers
