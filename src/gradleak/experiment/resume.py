"""Long jobs resume where they stopped. A job keeps each finished piece of its work (an
attack's chunk of victims, an FL run's state at its evaluation rounds) in a folder of its
own, ``results/partial/<phase>/<job>/<key>/``, outside its outputs, which Snakemake deletes
when a job fails or is killed. Run again (the same command, or SLURM's requeue), the job
loads those pieces instead of recomputing them; the global random generators are kept and
restored with each piece, so the result is byte-identical to an uninterrupted run.

``key`` digests the configuration values the job reads (its phase's ``params``) and the
code it runs (``experiment.code.job_digest``; ``gradleak <command>`` makes the folder): the
pieces of another configuration or code are never read. A kept piece is a cache: one that
no longer loads (a disk error, a half-copied folder) is discarded with a warning naming it,
and its work is done again. A finished job removes its folder.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gradleak.experiment import paths
from gradleak.utils.io import ArtifactError, load_torch, save_torch
from gradleak.utils.seeding import global_state, restore_global_state

T = TypeVar("T")


class Resume:
    """The kept pieces of one job, in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def kept(self) -> list[str]:
        """The names of the pieces kept so far."""
        return sorted(p.stem for p in self.folder.glob("*.pt")) if self.folder.is_dir() else []

    def _load(self, name: str, part: str) -> dict | None:
        """The kept file ``name`` (None: none, or a damaged one, discarded with a warning)."""
        path = self.folder / f"{name}.pt"
        if not path.is_file():
            return None
        try:
            kept = load_torch(path)
            if not isinstance(kept, dict) or {part, "random"} - set(kept):
                raise ArtifactError(f"{path} holds no kept {part} and generator state")
            return kept
        except ArtifactError as error:
            print(f"gradleak: warning: a damaged kept piece is discarded and its work done "
                  f"again: {error}", file=sys.stderr)
            path.unlink()
            return None

    def piece(self, name: str, compute: Callable[[], T], encode: Callable[[T], Any],
              decode: Callable[[Any], T]) -> T:
        """The piece ``name``: as kept, the global generators put back to their state after
        it; else ``compute()``, kept with the generators' state."""
        kept = self._load(name, "piece")
        if kept is not None:
            restore_global_state(kept["random"])
            return decode(kept["piece"])
        path = self.folder / f"{name}.pt"
        value = compute()
        save_torch(path, {"piece": encode(value), "random": global_state()})
        return value

    def latest(self, name: str, restore: bool = True) -> Any | None:
        """The state last kept as ``name`` (None: none); with ``restore``, the global
        generators put back to their state when it was kept."""
        kept = self._load(name, "state")
        if kept is None:
            return None
        if restore:
            restore_global_state(kept["random"])
        return kept["state"]

    def keep(self, name: str, state: Any) -> None:
        """Keep ``state`` as ``name`` (replacing the one before), with the generators'."""
        save_torch(self.folder / f"{name}.pt", {"state": state, "random": global_state()})

    def finish(self) -> None:
        """The job is done: its kept pieces (and folders left empty above them) go."""
        shutil.rmtree(self.folder, ignore_errors=True)
        for parent in self.folder.parents:
            try:  # a job beside it may be making a folder there: then it is not empty
                parent.rmdir()
            except OSError:  # not empty, or already gone
                break
            if parent.name == paths.PARTIAL:
                break


def resumed(resume: Resume | None, what: str, counter: str) -> dict:
    """``keep`` and ``resume_from`` for a training loop that hands ``keep`` its whole state
    (``counter``: its count of finished epochs or steps) and continues from
    ``resume_from``, the last state kept (none without ``resume``)."""
    if resume is None:
        return {}
    state = resume.latest("state")
    if state is not None:
        print(f"{what}: resuming after {counter} {state[counter]} from {resume.folder}",
              file=sys.stderr)
    return {"keep": lambda kept: resume.keep("state", kept), "resume_from": state}

