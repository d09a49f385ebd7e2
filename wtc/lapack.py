"""numpy's SVD-based solvers (lstsq, pinv) with their inputs checked finite first.

Why: OpenBLAS's LAPACK, which numpy's wheels ship, spins forever in dgesdd / dgelsd on a matrix
that mixes inf with finite entries (numpy issue #32591; measured here: a 3x3 with one inf never
returns, and a SIGALRM cannot interrupt it). wtc's regressions meet such matrices without any
bad input: the Gram matrix F'F of finite but large columns overflows. One held a test worker here
16+ minutes inside wtc.sr's pinv (the likely cause of a CI run past its 90 minutes). Every lstsq / pinv in wtc goes through here and raises numpy's
LinAlgError instead, which each caller treats as an unusable fit.
"""
from __future__ import annotations

import numpy as np


def _finite(name: str, *arrays: np.ndarray) -> None:
    for a in arrays:
        if not np.all(np.isfinite(a)):
            raise np.linalg.LinAlgError(f"{name}: the matrix has inf or NaN entries (LAPACK may not return on them)")


def lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The least-squares solution x of a x = b (np.linalg.lstsq, rcond=None)."""
    _finite("lstsq", a, b)
    return np.linalg.lstsq(a, b, rcond=None)[0]


def pinv(a: np.ndarray) -> np.ndarray:
    """The Moore-Penrose pseudo-inverse (np.linalg.pinv)."""
    _finite("pinv", a)
    return np.linalg.pinv(a)
