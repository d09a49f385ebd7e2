"""A sub-MLP under a prefix max / min that the program only compares with one number, read as the
indicator of that comparison.

With E = max(m[:t + 1]) and every use of E a cut `E >= c`, the program needs only b = [m >= c]:
max over the prefix commutes with any non-decreasing map, so `E >= c` is `max(b[:t + 1]) >= 1`
(for a min the same: `min(m) >= c` is `min(b) >= 1`; `E > c` takes b = [m > c]; `E < c` and
`E <= c` are the negations). The model's m is whatever its sub-MLP learned, read as a table
on the few inputs it sees (a polynomial through 16 points for x, prev1_x in 0..3), where b is a
predicate a person writes: `x < prev1_x`, "the prefix is still sorted" as `1 - max(m0[:t + 1])`.
b is read as the simplest formula whose values are b at every extraction point
(wtc.extraction.formulas, decisions); verification on fresh data decides as always.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import sympy as sp

from wtc.extraction.formulas import formula, values_of
from wtc.extraction.program import Line
from wtc.sr.expr import Ge

FORMULA_TIME_LIMIT = 5.0      # seconds for the regression of one indicator


def _cut(node, symbol: sp.Symbol) -> tuple[str, float] | None:
    """(op, c) when node compares symbol with a number, read as `symbol op c`: a relational (a
    Piecewise condition) or an indicator (wtc.sr.expr.Ge: 1 where a >= b, else 0)."""
    if isinstance(node, sp.core.relational.Relational):
        lhs, rhs, op = node.lhs, node.rhs, node.rel_op
    elif isinstance(node, Ge):
        (lhs, rhs), op = node.args, ">="
    else:
        return None
    if lhs == symbol and rhs.is_number:
        return op, float(rhs)
    if rhs == symbol and lhs.is_number:
        return {">=": "<=", ">": "<", "<=": ">=", "<": ">"}.get(op, op), float(lhs)
    return None


def _cuts(expr: sp.Expr, symbol: sp.Symbol) -> dict | None:
    """{node: (op, c)} for every comparison of symbol with a number in expr, or None if symbol
    appears anywhere else (its value, not only a cut of it, reaches the program)."""
    cuts, other = {}, 0

    def walk(node):
        nonlocal other
        cut = _cut(node, symbol)
        if cut is not None:
            cuts[node] = cut
        elif node == symbol:
            other += 1
        else:
            for arg in node.args:
                walk(arg)
    walk(sp.sympify(expr))
    return None if other else cuts


# (strict, holds_above) of `E op c`: b = [m > c] when strict else [m >= c]; the cut is b, or not b
_CANONICAL = {">=": (False, True), ">": (True, True), "<": (False, False), "<=": (True, False)}


def indicators_under_extremes(lines: list[Line], outputs: list[sp.Expr], values: dict[str, np.ndarray],
                              ) -> tuple[list[Line], list[sp.Expr], list[str]]:
    """(lines, outputs, notes) with each such sub-MLP line replaced by its indicator and its cuts by
    `E' >= 1` (or its negation). values: program name -> (n, T) values on the extraction data."""
    notes = []
    for ext in [ln for ln in lines if ln.kind in ("max", "min")]:
        sub = next((ln for ln in lines if ln.name == ext.source and ln.kind == "expr"), None)
        if sub is None or sub.name not in values:
            continue
        readers = [ln for ln in lines if ln is not ext and (ln.source == sub.name or (
            ln.expr is not None and sp.Symbol(sub.name) in ln.expr.free_symbols)
            or (ln.rule is not None and sub.name in (ln.rule.params.get("var"), ln.rule.params.get("query"))))]
        if readers or any(sp.Symbol(sub.name) in sp.sympify(e).free_symbols for e in outputs):
            continue                      # m is read elsewhere: its values matter, not only its cut
        symbol = sp.Symbol(ext.name)
        found = [_cuts(e, symbol) for e in outputs + [ln.expr for ln in lines if ln.expr is not None]]
        if any(f is None for f in found):
            continue
        cuts = {node: (c, *_CANONICAL[op]) for f in found for node, (op, c) in f.items() if op in _CANONICAL}
        if not cuts or len(cuts) != sum(map(len, found)) or len({(c, strict) for c, strict, _ in cuts.values()}) != 1:
            continue
        c, strict, _ = next(iter(cuts.values()))
        b = (values[sub.name] > c if strict else values[sub.name] >= c).astype(float)
        if b.min() == b.max():
            continue                      # the cut never changes on this data: nothing to read
        inputs = sorted(str(s) for s in sub.expr.free_symbols)
        if not inputs or any(n not in values for n in inputs):
            continue
        X = np.stack([values[n].ravel() for n in inputs], axis=1)
        expr, _, ok = formula(X, b.ravel(), tuple(inputs), 1e-3, widen=(1.0,), time_limit=FORMULA_TIME_LIMIT,
                              decisions=True)
        if not ok or not np.array_equal(values_of(expr, {n: values[n] for n in inputs}, b.shape), b):
            continue
        # the extreme of b is b's own 0 or 1: a cut of E is it (or 1 - it; a condition: == 1 / == 0)
        swap = {node: (symbol if above else 1 - symbol) if isinstance(node, Ge) else
                sp.Eq(symbol, 1 if above else 0) for node, (_, _, above) in cuts.items()}
        outputs = [sp.sympify(e).xreplace(swap) for e in outputs]
        lines = [dataclasses.replace(ln, expr=expr, comment=f"1 where the sub-MLP's output {'>' if strict else '>='} {c:g}, else 0")
                 if ln is sub else dataclasses.replace(ln, expr=ln.expr.xreplace(swap))
                 if ln.expr is not None else ln for ln in lines]
        notes.append(f"{sub.name} = {expr}: only [{sub.name} {'>' if strict else '>='} {c:g}] reaches the "
                     f"program (through {ext.kind}({sub.name}[:t + 1])), equal to it at every extraction point")
    return lines, outputs, notes
