"""Loading of the native module wtc._C (C++17/OpenMP kernels, always built by the package).

Nothing here is imported eagerly by ``import wtc``: the first call loads the module. Which op runs
through it is decided in wtc.backend (choose); this module only finds it.
"""
from __future__ import annotations

import functools
import importlib

from wtc.errors import BackendError


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


def dt_isa() -> str:
    """The instruction set the DT's native kernels (dt.route, dt.mlp_bank) run: "avx512", "avx2" or
    "portable", chosen when wtc._C loads from what the CPU runs and WTC_NATIVE_ISA
    (auto | avx512 | avx2 | portable; unset = auto, the widest). A WTC_NATIVE_ISA this CPU cannot run
    is an error (BackendError), never a silent fallback: a run that asked for the AVX2 path must not
    measure another one. Raises BackendError too when wtc._C is not built."""
    mod = cpu_module()
    if mod is None:
        raise BackendError(f"the native DT kernels need wtc._C, which is not importable: {import_error()}")
    try:
        return mod.dt_isa()
    except ValueError as exc:
        raise BackendError(str(exc)) from None


def dt_isa_report() -> str:
    """dt_isa() for a report line, never raising: "avx512 (CPU runs avx512, avx2, portable)", or the error."""
    try:
        isa = dt_isa()
    except BackendError as exc:
        return f"error: {exc}"
    return f"{isa} (CPU runs {', '.join(cpu_module().dt_isas())})"
