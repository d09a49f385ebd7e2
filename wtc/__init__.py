"""wtc — weights to code.

Train Discrete Transformers and read them out as programs; find invariant cores; explain single
weights. ``import wtc`` is light: torch, numpy-heavy modules and the native modules load on first
use of a name below. Every public subpackage is an attribute (``wtc.scan``, ``wtc.ace``, ...).
"""
from __future__ import annotations

import importlib

from wtc.backend import backends
from wtc.errors import WtcError
from wtc.tasks import Task

__version__ = "0.1.0"
"""The installed wtc version (as in pyproject.toml)."""

# Subpackages, resolved on first access.
_PACKAGES = ("tasks", "dt", "extraction", "sr", "scan", "explain", "ace", "models", "studies", "kernels")

# Public names resolved on first access so `import wtc` stays cheap (no torch import). No module
# is named like a function here, so an `import wtc.<module>` can never shadow one of these.
_NAMES = {
    "DTConfig": ("wtc.dt.config", "DTConfig"),
    "DiscreteTransformer": ("wtc.dt.model", "DiscreteTransformer"),
    "train": ("wtc.dt.train", "train"),
    "load": ("wtc.dt.checkpoint", "load"),
    "extract": ("wtc.extraction", "extract"),
    "verify": ("wtc.extraction", "verify"),
    "Program": ("wtc.extraction", "Program"),
    "Verification": ("wtc.extraction", "Verification"),
    "discover": ("wtc.discovery", "discover"),
    "Discovery": ("wtc.discovery", "Discovery"),
}

__all__ = ["Task", "WtcError", "backends", "__version__", *_PACKAGES, *_NAMES]


def __getattr__(name: str):
    if name in _PACKAGES:
        value = importlib.import_module(f"wtc.{name}")
    elif name in _NAMES:
        module_name, attr = _NAMES[name]
        value = getattr(importlib.import_module(module_name), attr)
    else:
        raise AttributeError(f"module 'wtc' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
