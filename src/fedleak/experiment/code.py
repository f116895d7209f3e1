"""The code a job runs, as files: the import closure of its phase's module and of the
modules that declare the artifacts it loads. A change to one of them re-runs the job; a
change anywhere else (another phase, the planning code, the CLI, the schema's text, the
docs) does not. The configuration values a job reads are its rule's ``params``, so a
changed schema default re-runs what reads it that way.

Read from the source with ``ast``, nothing imported: every ``import fedleak...`` and
``from fedleak... import ...``, at the top of a module or inside a function, and the
``__init__.py`` of every package on the way (Python runs it before the module). The package
imports its phase modules and artifact loaders by name (``experiment.phases.load``), which
is why they are named here explicitly.
"""

from __future__ import annotations

import ast
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


def job_files(phase, config: dict, results: Path, identity: dict,
              start: Path | str = ".") -> list[str]:
    """The source files one job runs: its phase's module and the modules declaring the
    artifacts it loads, with all they import (:func:`files`)."""
    loaders = artifacts.modules(phase.artifacts(config, results, identity))
    return _files(frozenset({phases.module_name(phase.name), *loaders}), str(start))


@cache
def _files(modules: frozenset[str], start: str) -> list[str]:
    return files(sorted(modules), start)
