"""Warm starts: the jobs of one local Snakemake run forked from one process that has already
imported torch, the package and the plotting stack, so that a job does not pay 2-5 s of
imports for 1-3 s of work (a paper's smoke run: hundreds of such jobs; docs/measurements.md).

The Snakefile starts the server when a local run of several jobs starts (``start``, its
``onstart``) and stops it when the run ends (``stop``); ``GRADLEAK_WARM_SOCKET`` names its
socket to the jobs. A phase's command (``gradleak attack ...``) then hands its arguments,
working folder, environment and standard streams to the server (``handoff``), which forks a
child that runs the command exactly as the process would have, while the command waits for
its exit status and passes on the signals it receives. The child is what a fresh process
would be after its imports: nothing the server loads computes, draws a random number or
starts a thread; every job seeds itself. Where the server cannot give that (another working
folder or environment than the one it imported under, its package's files edited since, no
server), the command runs as a cold process, as without warm starts;
``results/logs/warm.log`` names each job served (its status and seconds) and why one was
not.

A killed command (Snakemake interrupted, a SIGKILL) closes its connection and the server
kills its child at once; a server whose Snakemake is gone exits, and the folder of its
socket that a SIGKILLed server leaves the next run removes (``sweep``). ``GRADLEAK_WARM=0`` turns
warm starts off. Under SLURM the jobs run on other machines and start cold.

What differs from a cold job: Snakemake's ``benchmark:`` files sample the command's own
process, so their CPU time and memory columns miss the child's (their wall seconds are the
job's); ``gradleak estimate`` calibrates its own rates.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOCKET = "GRADLEAK_WARM_SOCKET"
SERVE = "_warm-serve"  # `python -m gradleak.cli _warm-serve SOCKET PID`: the server itself
SWITCH = "GRADLEAK_WARM"
# Set per job by the shell (its prompts, folder and depth) or by Snakemake (its tmpdir
# resource), read by no import.
VOLATILE = {"_", "PWD", "OLDPWD", "SHLVL", "PS1", "PS2", "PS4", "COLUMNS", "LINES", "TMPDIR",
            "TMP", "TEMP", "TEMPDIR", SOCKET}
# Snakemake's per-job thread variables for a rule of one thread (snakemake.shell), which the
# libraries read when they load: the server loads them under the jobs' values.
ONE_THREAD = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# What the jobs import (torch's optimizer step imports its compiler; the report loads
# seaborn and scipy.stats), loaded once by the server.
PRELOAD = ("torch", "torch._dynamo", "numpy", "scipy.optimize", "scipy.stats", "pandas",
           "matplotlib.pyplot", "seaborn", "sklearn.linear_model", "skimage.metrics",
           "gradleak.attacks", "gradleak.defenses", "gradleak.fl", "gradleak.adversaries",
           "gradleak.metrics", "gradleak.data", "gradleak.report")
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# The server's imports cost about two cold starts, and the jobs that start before it is
# ready run cold: a run of fewer jobs (a DVC stage's, one target re-made) starts none.
MIN_JOBS = 5
PACKAGE = Path(__file__).resolve().parent
PREFIX = "gradleak-warm-"  # the server's folder in the temporary folder
STALE_S = 600  # a folder still without its socket after this was left by a killed server
WAIT_S = 0.05  # the server's poll for ended children, closed connections and its parent


# -- the command's side -------------------------------------------------------------------

def handoff(argv: list[str]) -> int | None:
    """Run ``gradleak *argv`` in a child of the run's warm server and return its exit status;
    None where no server takes it (the caller then runs it itself)."""
    path = os.environ.get(SOCKET)
    if not path or os.environ.get(SWITCH) == "0":
        return None
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(path)
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
                   "umask": _umask()}
        socket.send_fds(conn, [json.dumps(request).encode()], _streams())
        reply = _line(conn)
    except OSError:
        conn.close()
        return None
    if not reply.startswith("pid "):  # refused: run cold
        conn.close()
        return None
    child = int(reply.split()[1])
    for number in SIGNALS:  # Snakemake's interrupt reaches the job through its command
        signal.signal(number, lambda n, _: _forward(child, n))
    try:
        status = _line(conn)
    except OSError:
        status = ""
    conn.close()
    kind, _, value = status.partition(" ")
    if kind == "signal":  # end as the child ended, as a shell reports it
        signal.signal(int(value), signal.SIG_DFL)
        os.kill(os.getpid(), int(value))
    return int(value) if kind == "exit" else 1


def _forward(child: int, number: int) -> None:
    try:
        os.kill(child, number)
    except ProcessLookupError:
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _streams() -> list[int]:
    """The standard streams' descriptors, /dev/null for a closed one."""
    found = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            found.append(fd)
        except OSError:
            found.append(os.open(os.devnull, os.O_RDWR))
    return found


def _line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(256)
        if not chunk:
            raise ConnectionError("the warm server closed the connection")
        data += chunk
    return data.decode().strip()


# -- the run's side -----------------------------------------------------------------------

def start(results: Path, jobs: int) -> None:
    """Start the server of a run of ``jobs`` jobs (the Snakefile's onstart) and name its
    socket to them; none for fewer than :data:`MIN_JOBS`."""
    if os.environ.get(SWITCH) == "0" or jobs < MIN_JOBS:
        return
    sweep(Path(tempfile.gettempdir()))
    folder = tempfile.mkdtemp(prefix=PREFIX)  # 0700: this user's alone
    path = os.path.join(folder, "socket")
    env = {**os.environ, **dict.fromkeys(ONE_THREAD, "1")}
    log = Path(results) / "logs" / "warm.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        subprocess.Popen([sys.executable, "-m", "gradleak.cli", SERVE, path, str(os.getpid())],
                         env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    os.environ[SOCKET] = path


def sweep(folder: Path, now: float | None = None) -> None:
    """Remove what killed servers left in ``folder``: this user's socket that no server
    listens on, or a folder with none after :data:`STALE_S` (killed as it imported)."""
    now = time.time() if now is None else now
    for left in folder.glob(PREFIX + "*"):
        try:
            if left.stat().st_uid != os.getuid():
                continue
            path = left / "socket"
            if path.exists():
                with socket.socket(socket.AF_UNIX) as probe:
                    try:
                        probe.connect(str(path))
                        continue  # a live server's
                    except ConnectionRefusedError:
                        path.unlink()
            elif now - left.stat().st_mtime < STALE_S:
                continue
            left.rmdir()
        except OSError:  # removed meanwhile, or not ours to remove
            continue


def stop() -> None:
    """Stop the run's server (the Snakefile's onsuccess and onerror)."""
    path = os.environ.pop(SOCKET, None)
    if not path:
        return
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(path)
            socket.send_fds(conn, [b'{"stop": true}'], [])
    except OSError:  # not started yet, or gone: it exits with its parent
        pass


class Server:
    """Forks a child per accepted command; one thread, so that forking is safe."""

    def __init__(self, path: str, parent: int, run, env: dict):
        """``env``: the environment the server started with, before its imports."""
        self.path, self.parent, self.run = path, parent, run
        self.cwd, self.env = os.getcwd(), _lasting(env)
        self.imported = {k: v for k, v in os.environ.items() if env.get(k) != v}
        self.source = _source()
        self.children: dict[int, tuple[socket.socket, list[str], float]] = {}
        self.selector = selectors.DefaultSelector()

    def serve(self) -> None:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(self.path + ".new")
        os.rename(self.path + ".new", self.path)  # whole when a command first sees it
        listener.listen(64)
        self.selector.register(listener, selectors.EVENT_READ)
        _log(f"ready: {len(sys.modules)} modules loaded")
        try:
            while self._parent_alive():
                for key, _ in self.selector.select(WAIT_S):
                    if key.fileobj is listener:
                        if not self._accept(listener):
                            return
                    else:  # a command's connection closed: it was killed
                        self._kill(key.data)
                self._reap()
        finally:
            for pid in list(self.children):
                self._kill(pid)
            self._reap(block=True)
            listener.close()
            os.unlink(self.path)
            try:  # the folder made for it (start)
                os.rmdir(os.path.dirname(self.path))
            except OSError:
                pass

    def _parent_alive(self) -> bool:
        try:
            os.kill(self.parent, 0)
            return True
        except ProcessLookupError:
            _log("the run's Snakemake is gone: exiting")
            return False

    def _accept(self, listener: socket.socket) -> bool:
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if not message:  # a probe that asked nothing: another run's sweep found it alive
            conn.close()
            return True
        request = json.loads(message)
        if request.get("stop"):
            conn.close()
            return False
        refusal = self._refusal(request)
        if refusal:
            _log(f"cold start: {' '.join(request['argv'][:1])}: {refusal}")
            conn.sendall(f"refused {refusal}\n".encode())
            conn.close()
            for fd in fds:
                os.close(fd)
            return True
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.selector.close()
            listener.close()
            _child(request, fds, conn, self.run, self.imported)
        for fd in fds:
            os.close(fd)
        self.children[pid] = (conn, request["argv"], time.monotonic())
        self.selector.register(conn, selectors.EVENT_READ, pid)
        conn.sendall(f"pid {pid}\n".encode())
        return True

    def _refusal(self, request: dict) -> str:
        """Why this server cannot run the command as a fresh process would ('' if it can)."""
        if request["cwd"] != self.cwd:
            return f"working folder {request['cwd']}, the server's is {self.cwd}"
        env = _lasting(request["env"])
        differ = sorted(k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k))
        if differ:
            return f"environment differs from the server's in {', '.join(differ)}"
        if _source() != self.source:
            return "the package's files changed since the server started"
        return ""

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _reap(self, block: bool = False) -> None:
        while self.children:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            if pid == 0:
                return
            if pid not in self.children:
                continue
            conn, argv, started = self.children.pop(pid)
            self.selector.unregister(conn)
            code = os.waitstatus_to_exitcode(status)
            _log(f"ran {' '.join(argv)}: {'exit' if code >= 0 else 'signal'} {abs(code)} "
                 f"after {time.monotonic() - started:.1f} s")
            try:
                conn.sendall((f"exit {code}" if code >= 0 else f"signal {-code}")
                             .encode() + b"\n")
            except OSError:  # the command is gone
                pass
            conn.close()


def _child(request: dict, fds: list[int], conn: socket.socket, run, imported: dict) -> None:
    """Become the command: its streams, folder, environment (with what the imports set in
    it, as its own imports would have) and signals; run; exit."""
    import atexit
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    conn.close()
    for number in (*SIGNALS, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python starts
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update({k: v for k, v in request["env"].items() if k != SOCKET})
    os.environ.update(imported)
    tempfile.tempdir = None  # found again from this environment
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
    sys.argv = ["gradleak", *request["argv"]]
    code = 1
    try:
        code = run(request["argv"])
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
        if isinstance(end.code, str):
            print(end.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, then exit 1
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


def _lasting(env) -> dict:
    return {k: v for k, v in env.items() if k not in VOLATILE}


def _source() -> list:
    """The package's Python files with their sizes and times: an edit changes it."""
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in PACKAGE.rglob("*.py"))


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} gradleak warm {os.getpid()}: {text}", flush=True)


def serve(path: str, parent: int, run) -> None:
    """Load what the jobs import, then serve the run's commands with ``run`` (cli.main)
    until the run stops it or its Snakemake (``parent``) is gone."""
    import importlib
    import threading

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    started, env = time.time(), dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    if threading.active_count() != 1:  # forking a threaded process is not safe
        _log(f"{threading.active_count()} threads after the imports: not serving")
        os.rmdir(os.path.dirname(path))
        return
    _log(f"imports took {time.time() - started:.1f} s")
    Server(path, parent, run, env).serve()
