"""Periodic aggregates in a program (wtc.dt.periodic): a prefix sum weighted by a periodic function
of the distance, out_t = sum_{j <= t} C[(t - j) mod p] * v_j, with C read from the model and written
as integers or simple fractions where it is one (else the exact floats)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

RATIONAL_DENOMINATORS = 4      # coefficients within RATIONAL_TOL of p / q, q <= this, are written as p / q
RATIONAL_TOL = 1e-3            # relative


def simple_number(value: float) -> int | float:
    """An integer, or p / q (q <= RATIONAL_DENOMINATORS) as a float, when value is within
    RATIONAL_TOL (relative) of one; else the float itself."""
    value = float(value)
    tol = RATIONAL_TOL * max(1.0, abs(value))
    if abs(value - round(value)) <= tol:
        return int(round(value))
    frac = Fraction(value).limit_denominator(RATIONAL_DENOMINATORS)
    return float(frac) if abs(value - float(frac)) <= tol else value


def weighted_prefix(values: np.ndarray, coefficients) -> np.ndarray:
    """values (n, T) -> (n, T): out_t = sum_{j <= t} coefficients[(t - j) mod p] values_j, one
    masked cumulative sum per phase j mod p (as the model computes it)."""
    c = np.asarray(coefficients, dtype=np.float64)
    p, T = len(c), values.shape[1]
    t = np.arange(T)
    out = np.zeros(values.shape, dtype=np.float64)
    for s in range(p):
        out += c[(t - s) % p] * np.cumsum(np.where(t % p == s, values, 0.0), axis=1)
    return out


def describe(coefficients) -> str:
    """'prefix sum weighted by (1, -1)[(t - j) % 2]' for the program's comment and the report."""
    return f"prefix sum weighted by {_literal(coefficients)}[(t - j) % {len(coefficients)}]"


def _literal(coefficients) -> str:
    items = [repr(int(c)) if isinstance(c, int) else repr(float(c)) for c in coefficients]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def periodic_source(name: str, series: str, coefficients) -> str:
    """The program statement: name[t] = sum(C[(t - j) % p] * series[j] for j in range(t + 1)), C
    the coefficients as Python number literals (ints stay ints)."""
    p = len(coefficients)
    return f"{name}[t] = sum({_literal(coefficients)}[(t - j) % {p}] * {series}[j] for j in range(t + 1))"
