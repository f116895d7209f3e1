"""gradleak: gradient-leakage attacks and defenses in federated learning.

Public API: ``attacks``, ``defenses``, ``data``, ``models``, ``metrics``
(``from gradleak import attacks``). The subpackages are imported when first used, so that a
pipeline job loads only the code it runs (``experiment.code``).
"""

import importlib

__version__ = "0.1.0"
__all__ = ["attacks", "data", "defenses", "metrics", "models", "__version__"]


def __getattr__(name: str):
    """``gradleak.attacks`` and the rest of the public API, imported on first use."""
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
