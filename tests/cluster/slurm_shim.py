#!/usr/bin/env python3
"""A stand-in for SLURM's client commands, for testing the SLURM profile without a cluster.

Linked under the names sbatch, srun, sacct, squeue, sinfo, scancel, scontrol, sacctmgr and
sshare; state lives in $SLURM_SHIM_DIR. ``sbatch`` records its arguments (one JSON line per
submission in calls.jsonl) and runs the job script in the background on this machine, as a
one-node cluster would; ``sacct``/``squeue`` report each job's state; ``srun`` runs its
command in place. Only what snakemake-executor-plugin-slurm calls is implemented.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

STATE = Path(os.environ.get("SLURM_SHIM_DIR", "/tmp/slurm-shim"))


def _jobs() -> dict[str, str]:
    """Job id -> state (RUNNING until its exit code is written)."""
    out = {}
    for path in sorted((STATE / "jobs").glob("*.pid")):
        code = path.with_suffix(".exit")
        state = "RUNNING"
        if code.is_file():
            value = code.read_text().strip()
            state = {"0": "COMPLETED", "cancelled": "CANCELLED"}.get(value, "FAILED")
        out[path.stem] = state
    return out


def _new_job_id() -> str:
    """The next free job id, reserved atomically: the executor's sbatch calls can overlap,
    and counting the jobs so far gave two submissions one id."""
    (STATE / "jobs").mkdir(parents=True, exist_ok=True)
    number = 1000
    while True:
        try:
            os.close(os.open(STATE / "jobs" / f"{number}.id", os.O_CREAT | os.O_EXCL))
            return str(number)
        except FileExistsError:
            number += 1


def sbatch(args: list[str]) -> None:
    wrap = next((a.split("=", 1)[1] for a in args if a.startswith("--wrap=")), None)
    script = f"#!/bin/sh\n{wrap}\n" if wrap is not None else sys.stdin.read()
    job_id = _new_job_id()
    with open(STATE / "calls.jsonl", "a") as log:
        log.write(json.dumps({"id": job_id, "args": args, "cwd": os.getcwd()}) + "\n")
    output = next((args[i + 1] for i, a in enumerate(args) if a == "--output"), None)
    logfile = (output or f"slurm-{job_id}.log").replace("%j", job_id)
    body = STATE / "jobs" / f"{job_id}.sh"
    body.write_text(script)
    env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id}
    runner = [sys.executable, __file__, "--run", job_id, str(body), logfile]
    proc = subprocess.Popen(runner, env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    (STATE / "jobs" / f"{job_id}.pid").write_text(str(proc.pid))
    print(job_id)


def run(job_id: str, body: str, logfile: str) -> None:
    Path(logfile).parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "w") as log:
        code = subprocess.call(["sh", body], stdout=log, stderr=subprocess.STDOUT)
    exit_file = STATE / "jobs" / f"{job_id}.exit"
    if not exit_file.exists():
        exit_file.write_text(str(code))


def srun(args: list[str]) -> None:
    """Drop srun's options and run the command (``sh -s`` reads the script from stdin)."""
    while args and args[0].startswith("-"):
        args = args[1:]
    os.execvp(args[0], args)


def status(_: list[str]) -> None:
    for job_id, state in _jobs().items():
        print(f"{job_id}|{state}")


def scancel(args: list[str]) -> None:
    for job_id in args:
        pid_file = STATE / "jobs" / f"{job_id}.pid"
        if pid_file.is_file():
            (STATE / "jobs" / f"{job_id}.exit").write_text("cancelled")
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass


def main() -> None:
    name, args = Path(sys.argv[0]).name, sys.argv[1:]
    if args[:1] == ["--run"]:
        return run(*args[1:])
    if name in ("sacctmgr", "sshare"):
        print(os.environ.get("SLURM_SHIM_ACCOUNT", "fedleak"))
    elif name == "scontrol":
        print("MinJobAge = 300 sec")
    elif name == "sinfo":
        print("PARTITION AVAIL\ncpu* up\ngpu up")
    else:
        {"sbatch": sbatch, "srun": srun, "sacct": status, "squeue": status,
         "scancel": scancel}[name](args)


if __name__ == "__main__":
    main()
