"""Loading of the native module wtc._C (C++17/OpenMP kernels, always built by the package).

Nothing here is imported eagerly by ``import wtc``: the first call loads the module. Which op runs
through it is decided in wtc.backend (choose); this module only finds it.
"""
from __future__ import annotations

import functools
import importlib


@functools.lru_cache(maxsize=None)
def _load():
    """(wtc._C or None, the import error's message)."""
    try:
        return importlib.import_module("wtc._C"), ""
    except ImportError as exc:
        return None, str(exc)


def cpu_module():
    """wtc._C, or None when the package was not built (e.g. a source checkout on sys.path)."""
    return _load()[0]


def import_error() -> str:
    """Why wtc._C did not import ("" when it did)."""
    return _load()[1]
