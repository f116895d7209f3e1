"""The README as a landing page and docs/ as a manual: generated pages current, the site
built strictly (every link and anchor resolves), no source citing a tracker or a file the
repository does not hold."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO

from gradleak.experiment.config_reference import config_reference

RUN = 'pip install -e . && snakemake --cores all'
TEST = 'pip install -e ".[test]" && python -m pytest -n auto'


def test_readme_is_a_landing_page_with_both_commands_first():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines"
    first = [line.strip() for line in lines[:30]]
    assert RUN in first and TEST in first


def test_config_reference_is_made_from_the_schema():
    """`gradleak config-reference > docs/config.md` after changing the schema."""
    page = (REPO / "docs" / "config.md").read_text()
    assert page == config_reference(), "stale: run gradleak config-reference > docs/config.md"
    cli = subprocess.run([sys.executable, "-m", "gradleak.cli", "config-reference"],
                         capture_output=True, text=True, cwd=REPO)
    assert cli.returncode == 0 and cli.stdout == page
    for key in ("fl.local_steps", "attack.protocol.batch_size", "defenses.<label>.strengths"):
        assert f"| `{key}` |" in page


def test_config_reference_names_every_defense_and_attack_parameter():
    page = (REPO / "docs" / "config.md").read_text()
    assert "### `soteria` (strength: `ratio`)" in page
    assert re.search(r"\| `iterations` \| integer, >= 1 \| `300` \|", page)  # DLG's budget


def test_the_manual_builds_strictly(tmp_path):
    """Every link, anchor and page of the nav resolves; a warning fails the build."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(tmp_path / "site")], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "config" / "index.html").is_file()


def test_no_source_cites_a_tracker_or_an_absent_file():
    """Code cites papers and decision records: no "issue N" (the tracker is not in the
    repository), no file the repository does not hold."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    for path in tracked:
        if path.startswith("src/") and path.endswith(".py"):
            text = (REPO / path).read_text()
            assert not re.search(r"\bissues? \d", text, flags=re.I), path
            for cited in re.findall(r"\b([A-Z_]{3,}\.md)\b", text):
                assert cited in {p.rsplit("/", 1)[-1] for p in tracked}, (path, cited)
