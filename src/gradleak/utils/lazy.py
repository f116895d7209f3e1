"""A package's names loaded on first use (PEP 562), for packages whose modules import
torch while some of them do not: ``__getattr__ = names_of(__name__, _HOMES)``
(``experiment.code`` counts every module of ``_HOMES`` as imported by the package)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def names_of(package: str, homes: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """The package's ``__getattr__``: a name of ``homes`` (module -> its names) from its
    module, or a submodule by name (``data.datasets``)."""
    home = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str):
        if name in home:
            return getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{package}.{name}":
                raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
