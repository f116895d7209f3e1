"""The validated configuration that a run's jobs read, results/config.resolved.json.

The Snakefile validates the configuration once, writes it there and exports the SHA-256
of those bytes (:data:`VALIDATED`) to the jobs it starts. A job whose file has those bytes
reads it as it is; any other file (a configuration given by hand, one edited since) is
validated, which imports every attack and defense, torch with them: what a light job
(a table and a figure) would otherwise spend most of its time on."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

VALIDATED = "GRADLEAK_VALIDATED_SHA256"


def export(path: str | os.PathLike) -> None:
    """The jobs this process starts read ``path`` (validated) without validating it."""
    os.environ[VALIDATED] = hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load(path: str | os.PathLike) -> dict:
    """The validated configuration in ``path``, defaults filled."""
    path = Path(path)
    if VALIDATED in os.environ and path.is_file():
        data = path.read_bytes()
        if os.environ[VALIDATED] == hashlib.sha256(data).hexdigest():
            return json.loads(data)
    from gradleak.experiment import configuration  # the registries, torch with them

    return configuration.load(path)
