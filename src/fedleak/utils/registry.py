"""A name -> class registry, shared by attacks and defenses."""

from __future__ import annotations


class Registry:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._classes: dict[str, type] = {}

    def register(self, name: str):
        """Class decorator: register under ``name`` and set ``cls.name``."""

        def decorator(cls: type) -> type:
            if name in self._classes:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            cls.name = name
            self._classes[name] = cls
            return cls

        return decorator

    def available(self) -> list[str]:
        return sorted(self._classes)

    def get(self, name: str) -> type:
        if name not in self._classes:
            raise ValueError(f"unknown {self.kind} {name!r}; expected one of {self.available()}")
        return self._classes[name]
