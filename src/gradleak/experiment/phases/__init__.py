"""The pipeline's phases, one module each (``experiment/phases/<name>.py`` declaring
``PHASE``, an ``experiment.phase.Phase``): a new module here is a new phase, its rule,
its ``gradleak`` command and its DVC stage.

A phase module is imported by name when it is needed (``load``), never by this package:
a job runs its phase's module and what that imports, nothing of the others, so its code
dependencies (``experiment.code``) are exactly those. Which phase declares each artifact
kind's files and loader is ``needs.ARTIFACTS``'s second entry.
"""

from __future__ import annotations

import importlib
import pkgutil

from gradleak.needs import ARTIFACTS

NAMES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)))
KINDS = {kind: phase for kind, (_, phase) in ARTIFACTS.items()}


def module_name(name: str) -> str:
    if name not in NAMES:
        raise ValueError(f"unknown phase {name!r}; expected one of {list(NAMES)}")
    return f"{__name__}.{name}"


def load(name: str):
    """The ``Phase`` declared by module ``name``."""
    return importlib.import_module(module_name(name)).PHASE


def _reach(every: dict) -> dict[str, set[str]]:
    """Phase -> every phase whose outputs its jobs read, directly or through others."""
    reach = {name: set(phase.reads) for name, phase in every.items()}
    changed = True
    while changed:
        changed = False
        for found in reach.values():
            more = set().union(*(reach[r] for r in found)) - found
            changed |= bool(more)
            found |= more
    return reach


def groups() -> list[list]:
    """The phases in groups that read each other's outputs (FL runs and RecUP-FL's zoo: the
    zoo learns from the undefended run, RecUP-FL's runs load the zoo), each group after the
    groups it reads, by name within and between equals."""
    every = {name: load(name) for name in NAMES}
    reach = _reach(every)
    circles = {name: tuple(sorted({name} | {n for n in reach[name] if name in reach[n]}))
               for name in every}
    ordered: list[list] = []
    done: set[str] = set()
    while len(done) < len(every):
        ready = sorted({c for name, c in circles.items() if name not in done
                        and reach[name] - set(c) <= done})
        ordered += [[every[n] for n in ready[0]]]
        done |= set(ready[0])
    return ordered


def every() -> list:
    """Every phase, each after the phases it reads (``groups``)."""
    return [phase for group in groups() for phase in group]


def by_command(command: str):
    """The phase of ``gradleak <command>`` (None: not a phase's command)."""
    name = command.replace("-", "_")
    return load(name) if name in NAMES else None


def kind(name: str):
    """The artifact ``Kind`` ``name``, from the phase that declares it."""
    if name not in KINDS:
        raise ValueError(f"unknown artifact kind {name!r}; expected one of {sorted(KINDS)}")
    return load(KINDS[name]).kinds[name]
