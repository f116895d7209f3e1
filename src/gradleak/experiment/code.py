"""The code a job runs, as files: the import closure of its phase's module and of the
modules that declare the artifacts it loads. A change to one of them re-runs the job; a
change anywhere else (another phase, the planning code, the CLI, the schema's text, the
docs) does not. Snakemake reads it as one digest of those files' contents in the rule's
``params`` (:func:`job_digest`: a ``touch`` or a fresh clone re-runs nothing, and the
scheduler has a few input files per job to look at, not the ~60 of its code); DVC as the
files (``experiment.dvc``). The configuration values a job reads are its rule's ``params``, so a
changed schema default re-runs what reads it that way.

Read from the source with ``ast``, nothing imported: every ``import gradleak...`` and
``from gradleak... import ...``, at the top of a module or inside a function, and the
``__init__.py`` of every package on the way (Python runs it before the module). A package
whose names load their modules on first use (``_HOMES``: ``data``, ``metrics``) counts as
importing all of them, as it did when it imported them itself. The package
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

from gradleak.experiment import artifacts, phases

PACKAGE = "gradleak"
ROOT = Path(__file__).resolve().parents[1]  # the imported package's folder, src/gradleak


def source(start: Path | str = ".") -> Path:
    """The package folder of the checkout at ``start`` (``start/src/gradleak``), whatever
    the environment imports; the imported one where ``start`` holds none."""
    own = Path(start).resolve() / "src" / PACKAGE
    return own if (own / "__init__.py").is_file() else ROOT


def foreign(start: Path | str = ".") -> str | None:
    """One line when the checkout at ``start`` holds a package whose files differ from
    the imported one's (an editable install made in another clone): its jobs run the
    imported code, while the digests and dvc.yaml read the checkout's. None otherwise."""
    own = source(start)
    if own == ROOT or _tree(own) == _tree(ROOT):
        return None
    return (f"the imported package {ROOT} is not this checkout's {own}, and their files "
            f"differ: jobs run the imported code; run `pip install -e .` here")


@cache
def _tree(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(f"{path.relative_to(root).as_posix()}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def file_of(module: str, root: Path = ROOT) -> Path | None:
    """The source file of ``gradleak.<...>`` ``module`` under the package folder ``root``
    (None: not a module of the package)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = root.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _statements(tree: ast.AST):
    """Every statement of ``tree``, nested ones too (an import is one): ``ast.walk`` less
    the expressions, which hold no statement and are most of a module's nodes."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for value in vars(node).values():
            if isinstance(value, list):
                todo += [v for v in value
                         if isinstance(v, (ast.stmt, ast.excepthandler, ast.match_case))]


@cache
def imports(module: str, root: Path = ROOT) -> frozenset[str]:
    """The package's modules that ``module``'s source imports anywhere in it."""
    tree = ast.parse(file_of(module, root).read_text())
    found: set[str] = set()
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:  # a submodule, else a name of the module itself
                sub = f"{node.module}.{alias.name}"
                found.add(sub if file_of(sub, root) is not None else node.module)
    found |= {f"{module}.{home}" for home in _lazy_homes(tree)}
    return frozenset(name for name in found if file_of(name, root) is not None)


def _lazy_homes(tree: ast.Module) -> list[str]:
    """The modules of a package's ``_HOMES`` (its names loaded on first use, PEP 562)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(n, "id", None) for n in node.targets] \
                == ["_HOMES"]:
            return list(ast.literal_eval(node.value))
    return []


def closure(modules: Iterable[str], root: Path = ROOT) -> list[Path]:
    """Every source file under ``root`` that running ``modules`` imports, theirs included,
    sorted."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages
        todo += imports(module, root)
    return sorted(file_of(module, root) for module in seen)


def files(modules: Iterable[str], start: Path | str = ".") -> list[str]:
    """:func:`closure` in the checkout at ``start`` (:func:`source`), as paths relative to
    ``start`` where the package lies under it."""
    start = Path(start).resolve()
    return [os.path.relpath(path, start) if path.is_relative_to(start) else str(path)
            for path in closure(modules, source(start))]


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


def job_digest(phase, config: dict, results: Path, identity: dict,
               start: Path | str = ".") -> str:
    """sha256 of the source files one job runs (:func:`job_files`, in the checkout at
    ``start``), each named by its path inside the package: the same in every clone,
    changed by an edit of one of them."""
    return _digest(job_modules(phase, config, results, identity), source(start))


@cache
def _digest(modules: frozenset[str], root: Path) -> str:
    digest = hashlib.sha256()
    for path in closure(sorted(modules), root):
        digest.update(f"{path.relative_to(root).as_posix()}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
