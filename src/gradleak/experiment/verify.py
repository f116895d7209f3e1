"""``gradleak verify``: every output that dvc.lock records, hashed again and compared.

A reviewer who pulled the artifacts (``dvc pull``) checks them without recomputing: DVC
hashes each file of each stage output (files inside output folders one by one) and compares
with the hashes that dvc.lock and its folder manifests record. Any file that differs, is
missing, or is not in the lock is named.
"""
from __future__ import annotations

from pathlib import Path


def _names(tree, prefix: str = "") -> list[str]:
    """The file paths of DVC's nested status tree ({'results': {'tables': {...}}} or
    a flat list of paths)."""
    if isinstance(tree, dict):
        return [name for key, sub in tree.items()
                for name in _names(sub, f"{prefix}{key}/")]
    return [f"{prefix}{item}" if prefix else str(item) for item in tree]


def mismatches(root: Path) -> tuple[int, dict[str, list[str]]]:
    """How many outputs dvc.lock records under ``root``, and what differs: 'modified',
    'deleted' (missing) and 'added' (not in the lock) files, each a sorted list."""
    from dvc.repo import Repo  # DVC is imported only when a reviewer verifies

    lock = root / "dvc.lock"
    if not lock.is_file():
        raise FileNotFoundError(f"{lock}: no dvc.lock (run `dvc repro` or check out the "
                                "commit that records the results)")
    with Repo(str(root)) as repo:
        outputs = [out for stage in repo.index.stages for out in stage.outs]
        status = repo.data_status(granular=True)
    changes = status["uncommitted"]
    found = {kind: sorted(name for name in _names(changes.get(kind, []))
                          if not name.endswith("/"))  # a folder differs: its files are named
             for kind in ("modified", "deleted", "added")}
    return len(outputs), {kind: names for kind, names in found.items() if names}


def verify(root: Path) -> None:
    """Print what was checked; raise ValueError naming every file that differs."""
    count, found = mismatches(root)
    if found:
        lines = [f"  {kind}: {name}" for kind, names in found.items() for name in names]
        raise ValueError(f"{sum(map(len, found.values()))} file(s) differ from dvc.lock:\n"
                         + "\n".join(lines))
    print(f"verified: {count} outputs, every file's hash as dvc.lock records it")
