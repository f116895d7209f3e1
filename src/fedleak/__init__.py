"""fedleak: gradient-leakage attacks and defenses in federated learning.

Public API (DESIGN §3): ``attacks``, ``defenses``, ``data``, ``models``, ``metrics``.
"""

from fedleak import attacks, data, defenses, metrics, models

__version__ = "0.1.0"
__all__ = ["attacks", "data", "defenses", "metrics", "models", "__version__"]
