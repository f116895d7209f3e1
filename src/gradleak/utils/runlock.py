"""The lock Snakemake keeps in ``.snakemake/locks`` while it runs, and the one a killed run
(SIGKILL, power loss) leaves behind, which would make the next plain ``snakemake`` fail
with "Directory cannot be locked" until someone runs ``snakemake --unlock``.

The workflow records which process owns the lock (host, pid, start time) beside the lock
files, before it writes anything; the next run removes a lock whose owner ran on this host
and is gone. A run that would lock while the recorded owner still runs on this host stops
at once (``RunInProgress``), before it writes anything, naming that run: Snakemake's own
advice there (``--unlock``) would break the live run. A lock of another host or of an
unknown owner is left alone (its remedy is printed). Snakemake deletes the whole folder,
the record with it, when a run ends normally.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import time
from pathlib import Path

OWNER = "gradleak-owner.json"
REMEDY = ("if no other snakemake runs in this directory, run `snakemake --unlock` (with the "
          "same --configfile) once, then the same command again")


class RunInProgress(RuntimeError):
    """Another run on this host holds (or is about to take) this folder's lock."""


def _started(pid: int) -> float | None:
    """When process ``pid`` started (None: gone, or unknown without psutil)."""
    try:
        import psutil  # a dependency of snakemake
    except ImportError:
        return None
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.Error:
        return -1.0  # exists, not ours to inspect


def _alive(owner: dict) -> bool:
    pid = int(owner.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    started = _started(pid)
    # a pid reused by a later process is not the owner
    return started is None or started == -1.0 or owner.get("started") in (None, started)


def _other_snakemake(workdir: str | os.PathLike) -> bool:
    """Whether another snakemake process (not this one or its parents) runs in ``workdir``."""
    try:
        import psutil
    except ImportError:
        return False
    here, mine = Path(workdir).resolve(), {os.getpid()}
    try:
        mine |= {p.pid for p in psutil.Process().parents()}
    except psutil.Error:
        pass
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid in mine or not any("snakemake" in part
                                           for part in proc.info["cmdline"] or []):
                continue
            if Path(proc.cwd()).resolve() == here:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def _clear_incomplete(workdir: Path) -> list[Path]:
    """Delete the outputs a killed run marked incomplete (its running jobs' outputs) and the
    marks, as ``--rerun-incomplete`` would: Snakemake then runs those jobs again."""
    marks = workdir / ".snakemake" / "incomplete"
    removed = []
    for mark in sorted(marks.rglob("*")) if marks.is_dir() else []:
        if not mark.is_file() or mark.name == "migration_underway":
            continue
        parts = mark.relative_to(marks).parts  # base64 of the path, split in chunks ("@...")
        try:
            output = Path(base64.urlsafe_b64decode("".join(p.lstrip("@") for p in parts))
                          .decode())
        except (ValueError, UnicodeDecodeError):
            continue
        target = output if output.is_absolute() else workdir / output
        if not target.resolve().is_relative_to(workdir.resolve()):
            continue  # only outputs inside the working directory
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
        mark.unlink(missing_ok=True)
        removed.append(output)
    return removed


def release_stale_lock(workdir: str | os.PathLike = ".", *, take: bool) -> str | None:
    """Remove the lock a killed Snakemake run left in ``workdir``; record this process as the
    owner of the lock it is about to take when ``take`` (a run that locks: not a dry run,
    not ``--nolock``, not a cluster job). Returns a line for the user, or None."""
    locks = Path(workdir) / ".snakemake" / "locks"
    held = sorted(locks.glob("*.lock")) if locks.is_dir() else []
    owner_file = locks / OWNER
    message = None
    try:
        owner = json.loads(owner_file.read_text())
    except (OSError, ValueError):
        owner = None
    if take and isinstance(owner, dict) and owner.get("host") == socket.gethostname() \
            and owner.get("pid") != os.getpid() and _alive(owner):
        started = owner.get("started")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) \
            if isinstance(started, (int, float)) and started > 0 else "at an unknown time"
        raise RunInProgress(
            f"gradleak: another snakemake run (pid {owner.get('pid')}, started {when}) is using "
            f"{Path(workdir).resolve()}; this one stopped before changing anything: wait for "
            f"that run to finish, or start this one in a copy of the project")
    if held:
        if not isinstance(owner, dict):
            return (f"gradleak: {locks} holds a lock of an unknown run; {REMEDY}")
        if owner.get("host") != socket.gethostname() or _alive(owner):
            return None  # a live run (or one on another host): Snakemake reports the conflict
        if _other_snakemake(workdir):
            return (f"gradleak: {locks} holds the lock of a killed run (pid {owner.get('pid')}), "
                    f"but another snakemake runs in this directory; when it is done, {REMEDY}")
        shutil.rmtree(locks, ignore_errors=True)
        redo = _clear_incomplete(Path(workdir))
        message = (f"gradleak: removed the lock that a killed run (pid {owner.get('pid')}) left "
                   f"in {locks}" + (f"; {len(redo)} unfinished outputs are made again"
                                    if redo else ""))
    if take:
        locks.mkdir(parents=True, exist_ok=True)
        owner = {"host": socket.gethostname(), "pid": os.getpid(),
                 "started": _started(os.getpid())}
        tmp = locks / f".{OWNER}.{os.getpid()}"
        tmp.write_text(json.dumps(owner))
        os.replace(tmp, owner_file)
    return message
