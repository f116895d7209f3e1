"""Atomic writers: every artifact is written to a temporary file, then renamed.

torch loads only where a tensor file is written or read, so that the table and figure jobs,
which write JSON, CSV and PNG files alone, do not import it."""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import pickle
import shutil
import socket
import tempfile
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


class ArtifactError(ValueError):
    """A file that exists but cannot be used: truncated, corrupted, of another kind, or
    holding Python objects that ``torch.load(weights_only=True)`` refuses to run."""


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{socket.gethostname()}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def _umask() -> int:
    """The process umask, read without changing it (Linux's /proc; elsewhere set and
    restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale_temporaries(path: Path) -> None:
    """Delete the temporary files of ``path`` that a killed writer on this host left."""
    host = socket.gethostname()
    for tmp in path.parent.glob(glob.escape(f".{path.name}.{host}-") + "*"):
        pid = tmp.name[len(f".{path.name}.{host}-"):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def make_folder(folder: Path, tries: int = 5) -> None:
    """``folder`` and the folders above it, made even while another job that just finished
    removes the empty folders above its own (``Resume.finish``): a parent that vanishes
    between two steps of ``mkdir(parents=True)`` is made again."""
    for attempt in range(tries):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            if attempt == tries - 1:
                raise


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path next to ``path``; rename it over ``path`` on success.

    The file ends with the permissions a plain ``open()`` would give it (0666 less the
    umask), not ``mkstemp``'s 0600, so colleagues sharing a results folder can read it.
    A writer killed half-way leaves only its temporary file (named after the host and its
    process id), which the next write of ``path`` removes; ``path`` itself is either the
    old file or the complete new one. A failed write (disk full) raises OSError naming
    ``path``, with nothing left behind."""
    path = Path(path)
    make_folder(path.parent)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=path.suffix, dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch.save reports a full disk as RuntimeError
        Path(tmp).unlink(missing_ok=True)
        reason = err.strerror if isinstance(err, OSError) and err.strerror else \
            " ".join(str(err).split())[:200]
        try:
            free = f" ({shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free on its disk)"
        except OSError:
            free = ""
        raise OSError(getattr(err, "errno", None) or errno.EIO,
                      f"cannot write {path}: {reason}{free}; nothing was written: free space "
                      f"(or fix the folder) and re-run") from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_with(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    text = json.dumps(obj, sort_keys=True, indent=2, allow_nan=True) + "\n"
    return _write_with(path, lambda t: t.write_text(text))


def write_text(path: str | os.PathLike, text: str) -> Path:
    return _write_with(path, lambda t: t.write_text(text))


def save_npy(path: str | os.PathLike, array: np.ndarray) -> Path:
    def writer(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, array, allow_pickle=False)

    return _write_with(path, writer)


def save_torch(path: str | os.PathLike, obj: Any) -> Path:
    """``obj`` (tensors, numbers, strings and containers) with every tensor on the CPU, so a
    file written by a CUDA job loads anywhere with ``weights_only=True``; the same object
    gives the same bytes wherever it is written (what DVC hashes)."""
    import torch

    from gradleak.utils.device import to_device

    cpu = to_device(obj, "cpu")

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as handle:  # a path would name the zip's root after the
            torch.save(cpu, handle)             # temporary file: other bytes every run
    return _write_with(path, write)


REMEDY = "delete it and re-run the step that writes it (snakemake re-creates missing files)"


def load_torch(path: str | os.PathLike, mmap: bool = False) -> Any:
    """A file ``save_torch`` wrote, read with ``weights_only=True``: tensors, numbers,
    strings and containers only, nothing executed; with ``mmap`` its tensors mapped, not
    read (their keys and shapes checked cheaply; a legacy non-zip file is read whole).
    FileNotFoundError when it is absent, ArtifactError naming it when it is truncated,
    corrupted or holds other objects."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        if mmap:
            with suppress(RuntimeError):  # a legacy (non-zip) file cannot be mapped
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's message wraps the reason in advice to pass weights_only=False: keep the reason
        parts = [" ".join(part.split()) for part in str(err).split("\n\n")]
        reason = " ".join(part.split("WeightsUnpickler error:")[-1].strip() for part in parts
                          if part and not part.startswith(("Weights only load failed",
                                                           "Check the documentation")))[:300]
        if "global" not in reason.lower():
            raise ArtifactError(f"{path} is not a readable torch file (corrupted: "
                                f"{reason or 'unpickling failed'}); {REMEDY}") from None
        raise ArtifactError(f"refused to load {path}: it holds Python objects other than "
                            f"tensors ({reason}); gradleak loads with weights_only=True and runs "
                            f"nothing from a file; {REMEDY}") from None
    except Exception as err:  # truncated zip, empty file, not a torch file at all
        reason = " ".join(str(err).split()).split(". ")[0][:200] or type(err).__name__
        raise ArtifactError(f"{path} is not a readable torch file (truncated or corrupted: "
                            f"{reason}); {REMEDY}") from None


def load_state(module: torch.nn.Module, state: Any, path: str | os.PathLike,
               what: str = "") -> torch.nn.Module:
    """``module.load_state_dict(state)``; ArtifactError naming ``path`` when ``state`` does
    not fit (a checkpoint of another model, case or configuration)."""
    try:
        module.load_state_dict(state)
    except (RuntimeError, TypeError, KeyError, AttributeError, ValueError) as err:
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        first = " ".join(lines[:2])[:300] if lines else type(err).__name__
        raise ArtifactError(f"{path} does not fit {what or type(module).__name__}: {first} "
                            f"(a checkpoint of another model, case or configuration?); "
                            f"{REMEDY}") from None
    return module


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in ``path`` (NaN allowed); ArtifactError naming it when it is not JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path} is not valid JSON (truncated or corrupted: {err}); "
                            f"{REMEDY}") from None


def load_npy(path: str | os.PathLike) -> np.ndarray:
    """An array ``save_npy`` wrote; ``allow_pickle=False``: an object array is refused.
    ArtifactError naming the file when it is not a readable ``.npy``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"array not found: {path}")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise ArtifactError(f"{path} is not a readable .npy array ({err}); {REMEDY}") from None


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_image_grid(images: torch.Tensor, path: str | os.PathLike, nrow: int) -> Path:
    """Images in [0, 1] as one PNG grid, ``nrow`` per row (torchvision's ``make_grid``)."""
    from PIL import Image
    from torchvision.utils import make_grid

    grid = make_grid(images.detach().cpu().clamp(0, 1), nrow=nrow, padding=2, pad_value=1.0)
    array = (grid.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    return _write_with(path, lambda tmp: Image.fromarray(array).save(tmp, format="PNG"))
