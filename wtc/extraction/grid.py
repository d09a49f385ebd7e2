"""A sub-MLP on a small grid of inputs read exactly: the interpolating polynomial.

A sub-MLP whose inputs take a few values each (digits 0..2 of two numbers: 9 input pairs) computes a
table, and a table of real numbers is often no short formula within the reading's tolerance (the
key a recency head scores was seen as a 3 x 3 table of unrounded values that the regression missed
by 5x its tolerance). Every function on a grid of n_1 x ... x n_k points is a polynomial of degree
below n_i in input i (the tensor-product Lagrange form), so such a table is read as that
polynomial: exact on every input seen, coefficients as simple rationals within the tolerance. The
program's domain (wtc.extraction.domain) refuses inputs off the grid, and verification decides,
as for every reading.
"""
from __future__ import annotations

import itertools

import numpy as np
import sympy as sp

from wtc import lapack

MAX_LEVELS = 7           # values per input (the digits of base 7)
MAX_TERMS = 49           # monomials (product of the inputs' value counts)


def grid_polynomial(X: np.ndarray, y: np.ndarray, names: tuple[str, ...], tol_abs: float) -> sp.Expr | None:
    """The polynomial through the mean of y at every distinct row of X (n, k), or None when the
    inputs are no small grid or the rounded polynomial misses y by more than tol_abs (rms)."""
    levels = [np.unique(X[:, i]) for i in range(X.shape[1])]
    if not levels or any(len(v) > MAX_LEVELS for v in levels) or int(np.prod([len(v) for v in levels])) > MAX_TERMS:
        return None
    rows, inverse = np.unique(X, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    mean = np.bincount(inverse, weights=y) / np.bincount(inverse)
    powers = list(itertools.product(*[range(len(v)) for v in levels]))
    design = np.stack([np.prod([rows[:, i] ** p for i, p in enumerate(ps)], axis=0) for ps in powers], axis=1)
    try:
        coef = lapack.lstsq(design, mean)
    except np.linalg.LinAlgError:          # a power overflowed, or y is not finite
        return None
    counts = np.bincount(inverse)
    symbols = [sp.Symbol(n) for n in names]
    for digits in range(1, 13):            # the fewest decimals that keep every input seen within tol_abs
        rounded = np.round(coef, digits)
        if float(np.sqrt(np.sum(counts * (design @ rounded - mean) ** 2) / counts.sum())) <= tol_abs:
            break
    else:
        return None
    expr = sp.Integer(0)
    for c, ps in zip(rounded, powers):
        if c != 0:
            value = sp.Integer(int(c)) if float(c).is_integer() else sp.Float(float(c), digits + 1)
            expr += value * sp.Mul(*[s ** p for s, p in zip(symbols, ps)])
    f = sp.lambdify(symbols, expr, modules=["numpy"])
    got = np.broadcast_to(np.asarray(f(*X.T), dtype=float), y.shape)
    return expr if float(np.sqrt(np.mean((got - y) ** 2))) <= tol_abs else None
