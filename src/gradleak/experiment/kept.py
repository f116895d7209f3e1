"""Kept pieces (``experiment.resume``) by the job that reads them: the folder one job keeps
its pieces in, and the folders under ``results/partial/`` that no planned job of a
configuration reads (``gradleak clean``: a killed job of an earlier configuration or code
leaves its pieces behind, an FL state of a ResNet-18 with its optimiser tens of MB each).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from gradleak.experiment import code, paths, phases, pipeline
from gradleak.experiment.resume import Resume


def folder(phase, config: dict, results: Path, identity: dict) -> Path:
    """Where one job keeps its finished pieces: a folder of its own, named by the
    configuration values it reads and the code it runs."""
    digest = hashlib.sha256(json.dumps(phase.params(config, results, identity), sort_keys=True,
                                       default=str).encode())
    digest.update(code.job_digest(phase, config, results, identity).encode())
    parts = [part.format(**identity) for part in phase.path_parts()]
    return paths.partial_dir(results, phase.name, parts) / digest.hexdigest()[:16]


def resume(phase, config: dict, results: Path, identity: dict) -> Resume:
    return Resume(folder(phase, config, results, identity))


def unread(config: dict, results: Path) -> list[tuple[Path, int]]:
    """The kept-piece folders under ``results`` that no planned job of ``config`` reads,
    each with its size in bytes, sorted by path."""
    root = Path(results) / paths.PARTIAL
    if not root.is_dir():
        return []
    jobs = pipeline.walk(config, results)
    wanted = {folder(phase, config, results, identity)
              for phase in phases.every() if phase.resumable for identity in jobs[phase.name]}
    found = sorted({p.parent for p in root.rglob("*") if p.is_file()})
    return [(f, sum(p.stat().st_size for p in f.rglob("*") if p.is_file()))
            for f in found if f not in wanted]


def clean(config: dict, results: Path, remove: bool) -> str:
    """The text of ``gradleak clean``: each unread folder with its size, and the total;
    with ``remove``, the folders are deleted (and the empty folders above them)."""
    found = unread(config, results)
    lines = [f"{_size(size):>9}  {path}" for path, size in found]
    total = _size(sum(size for _, size in found))
    if not found:
        return f"no kept pieces that no planned job reads under {results}\n"
    if remove:
        for path, _ in found:
            shutil.rmtree(path)
        for empty in sorted((Path(results) / paths.PARTIAL).rglob("*"), reverse=True):
            if empty.is_dir() and not any(empty.iterdir()):
                empty.rmdir()
        lines.append(f"removed {len(found)} folder(s), {total}")
    else:
        lines.append(f"{len(found)} folder(s), {total}, that no planned job reads: "
                     f"`gradleak clean --remove` deletes them")
    return "\n".join(lines) + "\n"


def _size(size: float) -> str:
    if size < 1000:
        return f"{size:.0f} B"
    for unit in ("kB", "MB"):
        size /= 1000
        if size < 1000:
            return f"{size:.1f} {unit}"
    return f"{size / 1000:.1f} GB"
