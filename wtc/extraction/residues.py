"""A sub-MLP with periodic units (DTConfig.mlp_periods) read through a residue of one input.

Its periodic units add a learned combination of cos / sin(2 pi a v / P) of each input v, which is
any function of v mod P; the rest of the sub-MLP is smooth. Error diffusion by 15 (the level
floor(S / 15) of a prefix sum S, read as -0.32 (S mod 15) + 0.019 S + 1.42) is such a sub-MLP:
a regression over S alone finds a sine of nearly the right period, right on the lengths seen and
wrong beyond them, and no integer operator applies to a real-valued output.

The reading: for each whole-number input v spanning at least MIN_CYCLES periods and each period P
of the model (smallest first), least squares of y on the inputs and the indicators of v mod P; where
that is within tolerance, the regression is run again over the inputs and r = v mod P as a column
of its own, and r is put back as `v % P` in the formula found. The SR sees P distinct values of r,
so a linear function of the residue is as easy to it as a linear function of anything.
"""
from __future__ import annotations

import numpy as np
import sympy as sp

MIN_CYCLES = 2          # an input spanning fewer periods is a table of itself, not of its residue
MAX_REGRESSIONS = 2     # (input, period) pairs whose table fits that get a regression, per sub-MLP


def residue_design(X: np.ndarray, column: int, period: int) -> np.ndarray:
    """(n, 1 + k + P - 1): a constant, the inputs, the indicators of X[:, column] mod P (one left out)."""
    r = np.mod(X[:, column], period).astype(np.int64)
    onehot = (r[:, None] == np.arange(1, period)[None, :]).astype(float)
    return np.concatenate([np.ones((len(X), 1)), X, onehot], axis=1)


def residue_fits(X: np.ndarray, y: np.ndarray, period: int, column: int) -> float:
    """rms of y minus its least-squares fit by the inputs and a table of X[:, column] mod period."""
    A = residue_design(X, column, period)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(np.sqrt(np.mean((A @ coef - y) ** 2)))


def residue_formula(X: np.ndarray, y: np.ndarray, names: tuple[str, ...], periods, tol_abs: float,
                    read, widen=(1.0, 3.0, 10.0)) -> tuple[sp.Expr, str] | None:
    """y (n,) as a formula of the inputs X (n, k) and one input's residue modulo a period, or None.

    `read(X, y, names)` is the caller's regression -> (expr, evidence, passed) (the reader's formula
    with its moduli and time limit). The first (input, period) whose table fit is within the widest
    tolerance and whose regression passes with the residue in it is the reading; at most
    MAX_REGRESSIONS pairs are regressed."""
    whole = [j for j in range(X.shape[1]) if np.array_equal(X[:, j], np.round(X[:, j]))]
    limit = widen[-1] * tol_abs
    tries = 0
    for period in sorted({int(p) for p in periods if p >= 2}):
        for j in whole:
            if np.ptp(X[:, j]) < MIN_CYCLES * period or residue_fits(X, y, period, j) > limit:
                continue
            if tries == MAX_REGRESSIONS:      # each regression is seconds: the reading's time stays bounded
                return None
            tries += 1
            r = sp.Symbol(_unused(f"{names[j]}_mod_{period}", names))
            X2 = np.concatenate([X, np.mod(X[:, j], period)[:, None]], axis=1)
            expr, evidence, ok = read(X2, y, tuple(names) + (r.name,))
            if not ok:
                continue
            if r not in expr.free_symbols:   # the regression wrote what it needed itself (its moduli)
                return expr, evidence
            expr = expr.subs(r, sp.Mod(sp.Symbol(names[j]), period))
            return expr, f"{evidence}; {names[j]} read modulo {period} (the model's periodic units)"
    return None


def _unused(name: str, names) -> str:
    while name in names:
        name += "_"
    return name
