"""A name -> class registry for attacks and defenses, with one factory that fills each
class's defaults from the configuration schema (``gradleak.config``) and rejects unknown
keyword arguments by name.

A registered class takes its schema parameters as keyword arguments (no defaults of its
own), plus ``seed`` when it has one, plus the artifacts it declares in ``needs``
(``{argument: Need(kind, when)}``; ``needs_for(params)`` may compute them instead).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from gradleak import config, plugins
from gradleak.needs import ARTIFACTS, artifact_parts


class Registry:
    def __init__(self, kind: str) -> None:
        if kind not in ("attacks", "defenses"):
            raise ValueError(f"registry kind must be 'attacks' or 'defenses', got {kind!r}")
        self.kind = kind
        self._built_in: dict[str, type] = {}
        self._plugged = False

    @property
    def noun(self) -> str:
        return self.kind[:-1]

    def register(self, name: str):
        """Class decorator: register under ``name`` and set ``cls.name``."""

        def decorator(cls: type) -> type:
            if name in self._built_in:
                raise ValueError(f"{self.noun} {name!r} registered twice")
            cls.name = name
            self._built_in[name] = cls
            return cls

        return decorator

    @property
    def _classes(self) -> dict[str, type]:
        """The built-in classes and, once asked for, the installed plugins' (their entry
        points load at the first lookup, when every built-in module is imported)."""
        if not self._plugged:
            self._plugged = True
            plugins.definitions(self.kind, self._built_in)  # refuses a built-in's name
            for name, cls, _ in plugins.found(self.kind):
                self.register(name)(cls)
        return self._built_in

    def available(self) -> list[str]:
        return sorted(self._classes)

    def get(self, name: str) -> type:
        if name not in self._classes:
            raise ValueError(f"unknown {self.noun} {name!r}; expected one of {self.available()}")
        return self._classes[name]

    def needs(self, name: str, params: Mapping[str, Any]) -> dict[str, str]:
        """The artifacts (argument -> kind) that ``name`` with resolved ``params`` needs."""
        return needs_for(self.get(name), params)

    def build(self, name: str, **kwargs: Any):
        """``name`` with ``kwargs`` over its schema defaults, plus the artifacts it needs."""
        cls = self.get(name)
        schema_keys = config.parameters(self.kind, name)
        params = {k: v for k, v in kwargs.items() if k in schema_keys}
        try:
            resolved = config.resolve(self.kind, name, params, prefix=f"{self.noun} {name!r}")
        except config.ConfigError as err:  # add how to pass the value
            param = (err.key or "").split(".")[0].split("[")[0]
            if param not in schema_keys:
                raise
            default = config.definition(self.kind, name)["properties"][param].get("default")
            hint = (f"; pass e.g. {self.kind}.build({name!r}, {param}={default!r}) (the "
                    f"default)" if default is not None else "")
            raise config.ConfigError(f"{err}{hint}", key=err.key) from None
        seed = kwargs.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"{self.noun} {name!r}: seed must be an int >= 0, got {seed!r}; "
                            f"pass e.g. seed=0")
        if seed is not None and seed < 0:
            raise ValueError(f"{self.noun} {name!r}: seed must be >= 0, got {seed}; pass e.g. "
                             f"seed=0")
        needed = needs_for(cls, resolved)
        extra = {"seed"} if "seed" in inspect.signature(cls).parameters else set()
        extra |= set(getattr(cls, "needs", {}))  # declared artifacts, needed or not here
        allowed = set(schema_keys) | set(needed) | extra
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
            raise TypeError(f"{self.noun} {name!r} got an unknown keyword argument {unknown[0]!r}"
                            f"{f' (did you mean {close[0]!r}?)' if close else ''}; "
                            f"expected some of {sorted(allowed)}")
        missing = sorted(k for k in needed if kwargs.get(k) is None)
        if missing:
            raise ValueError(f"{self.noun} {name!r} needs {missing[0]}=: "
                             f"{ARTIFACTS[artifact_parts(needed[missing[0]])[0]][0]}; got none")
        artifacts = {k: kwargs[k] for k in (set(needed) | extra) & set(kwargs)}
        return cls(**resolved, **artifacts)


def needs_for(cls: type, params: Mapping[str, Any]) -> dict[str, str]:
    """``cls.needs_for(params)`` when the class computes its needs, else its ``needs`` that
    apply to ``params``."""
    if hasattr(cls, "needs_for"):
        return cls.needs_for(params)
    return {arg: need.kind for arg, need in getattr(cls, "needs", {}).items()
            if need.applies(params)}
