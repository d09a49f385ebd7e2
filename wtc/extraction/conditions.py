"""A "latest where" predicate read back in the inputs it comes from, where they take few values.

A recency line's predicate is a threshold on a key variable, and the key is often a sub-MLP's
polynomial in input channels with few values: binary addition's carry reads "the latest j where
-1 < m1", with m1 = 5.226 x0 x1 - 2.62 x0 - 2.62 x1 + 1.22. On the channels' values that predicate
is exactly x0 == x1 (the digit sum is not base - 1). This module evaluates the predicate on every
combination of the key's inputs (the domain the program was verified on) and returns the simplest
condition of a short list of forms that agrees on all of them, or None. The program then reads
`if x0[t] == x1[t]:`; it is verified as emitted (fresh draws, exhaustively where small, at 2T).
"""
from __future__ import annotations

import itertools

import numpy as np
import sympy as sp

from wtc.extraction.routing_rules import satisfies

MAX_COMBINATIONS = 4096      # combinations of the key's input values evaluated at most


def finite_condition(key: sp.Expr, params: dict, values: dict[str, tuple[float, ...]], at) -> str | None:
    """The simplest condition on the key's inputs equal to the predicate `params` (a "latest
    where" rule's) on key = `key` over every combination of `values` (input name -> its values),
    as Python text with `at(name)` for an input at the current position; None when the key reads
    other variables, the combinations are too many, or no listed form agrees."""
    names = sorted(str(s) for s in key.free_symbols)
    if not names or len(names) > 2 or any(n not in values for n in names):
        return None
    grids = [np.asarray(values[n], dtype=float) for n in names]
    if int(np.prod([len(g) for g in grids])) > MAX_COMBINATIONS:
        return None
    points = np.array(list(itertools.product(*grids)), dtype=float)          # (combinations, inputs)
    f = sp.lambdify([sp.Symbol(n) for n in names], key, modules="numpy")
    keys = np.broadcast_to(np.asarray(f(*points.T), dtype=float), (len(points),))
    truth = satisfies(params, keys)
    if truth.all() or not truth.any():
        return None                  # constant on the domain: the reader's own text says more
    for text, holds in _forms(names, points, at):
        if np.array_equal(holds, truth):
            return text
    return None


def _forms(names: list[str], points: np.ndarray, at):
    """(text, truth over points) of candidate conditions, simplest first: one input against a
    value, two inputs equal or not, their sum or difference against a value."""
    def against(expr_text: str, v: np.ndarray):
        for c in sorted(set(v.tolist())):
            num = _num(c)
            yield f"{expr_text} == {num}", v == c
            yield f"{expr_text} != {num}", v != c
        for c in sorted(set(v.tolist()))[1:]:
            yield f"{expr_text} >= {_num(c)}", v >= c
        for c in sorted(set(v.tolist()))[:-1]:
            yield f"{expr_text} <= {_num(c)}", v <= c

    cols = [points[:, i] for i in range(len(names))]
    for n, v in zip(names, cols):
        yield from against(at(n), v)
    if len(names) == 2:
        a, b = (at(n) for n in names)
        yield f"{a} == {b}", cols[0] == cols[1]
        yield f"{a} != {b}", cols[0] != cols[1]
        yield from against(f"{a} + {b}", cols[0] + cols[1])
        yield from against(f"{a} - {b}", cols[0] - cols[1])


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))
