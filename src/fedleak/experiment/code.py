"""The code a job runs, as files: the import closure of its phase's module and of the
modules that declare the artifacts it loads. A change to one of them re-runs the job; a
change anywhere else (another phase, the planning code, the CLI, the schema's text, the
docs) does not. Snakemake reads it as one digest of those files' contents in the rule's
``params`` (:func:`job_digest`: a ``touch`` or a fresh clone re-runs nothing, and the
scheduler has a few input files per job to look at, not the ~60 of its code); DVC as the
files (``experiment.dvc``). The configuration values a job reads are its rule's ``params``, so a
changed schema default re-runs what reads it that way.

Read from the source with ``ast``, nothing imported: every ``import fedleak...`` and
``from fedleak... import ...``, at the top of a module or inside a function, and the
``__init__.py`` of every package on the way (Python runs it before the module). The package
imports its phase modules and artifact loaders by name (``experiment.phases.load``), which
is why they are named here explicitly.
"""

from __future__ import annotations

import ast
import hashlib
import os
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from fedleak.experiment import artifacts, phases

PACKAGE = "fedleak"
ROOT = Path(__file__).resolve().parents[1]  # src/fedleak


def file_of(module: str) -> Path | None:
    """The source file of ``fedleak.<...>`` ``module`` (None: not a module of the package)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = ROOT.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@cache
def imports(module: str) -> frozenset[str]:
    """The package's modules that ``module``'s source imports anywhere in it."""
    tree = ast.parse(file_of(module).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:  # a submodule, else a name of the module itself
                sub = f"{node.module}.{alias.name}"
                found.add(sub if file_of(sub) is not None else node.module)
    return frozenset(name for name in found if file_of(name) is not None)


def closure(modules: Iterable[str]) -> list[Path]:
    """Every source file that running ``modules`` imports, theirs included, sorted."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages
        todo += imports(module)
    return sorted(file_of(module) for module in seen)


def files(modules: Iterable[str], start: Path | str = ".") -> list[str]:
    """:func:`closure` as paths relative to ``start`` where the package lies under it."""
    return [os.path.relpath(path, start) if path.is_relative_to(Path(start).resolve())
            else str(path) for path in closure(modules)]


def job_modules(phase, config: dict, results: Path, identity: dict) -> frozenset[str]:
    """The modules one job runs: its phase's module and those declaring the artifacts it
    loads (their imports: :func:`closure`)."""
    loaders = artifacts.modules(phase.artifacts(config, results, identity))
    return frozenset({phases.module_name(phase.name), *loaders})


def job_files(phase, config: dict, results: Path, identity: dict,
              start: Path | str = ".") -> list[str]:
    """The source files one job runs (:func:`job_modules`, with all they import)."""
    return _files(job_modules(phase, config, results, identity), str(start))


@cache
def _files(modules: frozenset[str], start: str) -> list[str]:
    return files(sorted(modules), start)


def job_digest(phase, config: dict, results: Path, identity: dict) -> str:
    """sha256 of the source files one job runs (:func:`job_files`), each named by its path
    inside the package: the same in every clone, changed by an edit of one of them."""
    return _digest(job_modules(phase, config, results, identity))


@cache
def _digest(modules: frozenset[str]) -> str:
    digest = hashlib.sha256()
    for path in closure(sorted(modules)):
        digest.update(f"{path.relative_to(ROOT).as_posix()}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
