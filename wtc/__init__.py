"""wtc — weights to code.

Train Discrete Transformers and read them out as programs; find invariant cores; explain single
weights. ``import wtc`` is light: torch and the native modules load on first use.
"""
from __future__ import annotations

import importlib
import sys
import types

from wtc._native import backends
from wtc.tasks import Task

__version__ = "0.1.0"

# Public names resolved on first access so `import wtc` stays cheap (no torch import).
_LAZY = {
    "tasks": ("wtc.tasks", None),
    "dt": ("wtc.dt", None),
    "DTConfig": ("wtc.dt.config", "DTConfig"),
    "DiscreteTransformer": ("wtc.dt.model", "DiscreteTransformer"),
    "train": ("wtc.dt.train", "train"),
    "load": ("wtc.dt.checkpoint", "load"),
    "extract": ("wtc.extract", "extract"),
    "verify": ("wtc.extract", "verify"),
    "Program": ("wtc.extract", "Program"),
    "Verification": ("wtc.extract", "Verification"),
    "discover": ("wtc.discover", "discover"),
    "Discovery": ("wtc.discover", "Discovery"),
    "sr": ("wtc.sr", None),
}

__all__ = ["Task", "backends", "__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'wtc' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """The import system binds every loaded submodule on its package (``wtc.extract`` the package
    would replace ``wtc.extract`` the function once anything ran ``import wtc.extract``). Public
    names that are functions keep winning; the submodules stay reachable through ``sys.modules``
    and ``from wtc.extract import ...``."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name, (None, None))[1] is not None:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
