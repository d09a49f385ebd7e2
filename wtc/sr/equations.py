"""The estimator's equations table, PySR style: rows, the selected row, row lookup, LaTeX.

One table per output: a pandas DataFrame when pandas is installed (columns complexity, loss,
score, equation, sympy_format, lambda_format, passes), else a list of dicts with those keys.
``lambda_format`` is a :class:`NumpyFormula`, a picklable callable X (n, d) -> (n,).
With several outputs the estimator holds a list of tables and every lookup takes a list of row
indices, one per output (PySR's convention).
"""
from __future__ import annotations

import math

import numpy as np
import sympy as sp

from wtc.errors import SRError
from wtc.sr.api import Fit
from wtc.sr.pareto import _decimalise

COLUMNS = ("complexity", "loss", "score", "equation", "sympy_format", "lambda_format", "passes")


class EquationIndexError(SRError, IndexError):
    """A row index past the equations table (also an IndexError, as pandas' iloc raises)."""


def pandas_or_none():
    """pandas, or None when it is not installed (the tables are then lists of dicts)."""
    try:
        import pandas
    except ImportError:
        return None
    return pandas


class NumpyFormula:
    """A formula as a callable on X (n, d), columns in the order of ``names``; compiled on first
    use and again after unpickling (a lambdified function does not pickle)."""

    def __init__(self, expr: sp.Expr, names: tuple):
        self.expr, self.names = expr, tuple(names)
        self._fn = None

    def __call__(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(self.names):
            raise SRError(f"X must have shape (n, {len(self.names)}) for this formula, got {X.shape}")
        if self._fn is None:
            syms = tuple(sp.Symbol(s) for s in self.names)
            self._fn = sp.lambdify(syms, self.expr, modules="numpy", dummify=True)
        with np.errstate(all="ignore"):
            out = self._fn(*[X[:, i] for i in range(X.shape[1])])
        return np.broadcast_to(np.asarray(out, dtype=np.float64), (len(X),)).copy()

    def __getstate__(self):
        return {"expr": self.expr, "names": self.names}

    def __setstate__(self, state):
        self.expr, self.names, self._fn = state["expr"], state["names"], None

    def __repr__(self) -> str:
        return f"NumpyFormula({', '.join(self.names)} -> {self.expr})"


def _row(complexity, loss, score, equation, expr, names, passes) -> dict:
    return {"complexity": int(complexity), "loss": float(loss), "score": float(score), "equation": equation,
            "sympy_format": expr, "lambda_format": NumpyFormula(expr, names), "passes": bool(passes)}


def table(f: Fit):
    """The Pareto table of one fit: DataFrame (pandas) or list of dicts."""
    rows = [_row(r.complexity, r.loss, r.score, r.equation, r.expr, f.names, r.passes) for r in f.candidates]
    pd = pandas_or_none()
    if pd is None:
        return rows
    return pd.DataFrame(rows, columns=list(COLUMNS))


def best_row(f: Fit, tab):
    """The selected formula as a row of the table's kind: its own expression (simplified), loss and
    complexity; the score of the table row of the same complexity (NaN when there is none). As a
    Series it is named after that row's index (None when there is none)."""
    rows = tab.to_dict("records") if not isinstance(tab, list) else tab
    same = [i for i, r in enumerate(rows) if r["complexity"] == f.complexity]
    score = rows[same[0]]["score"] if same else math.nan
    row = _row(f.complexity, f.loss, score, f.equation, f.expr, f.names, f.exact)
    pd = pandas_or_none()
    if isinstance(tab, list) or pd is None:
        return row
    return pd.Series(row, name=tab.index[same[0]] if same else None)


def row_at(tab, index, output: int | None = None):
    """Row ``index`` of the table (negative counts from the end, as iloc does)."""
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
        raise SRError(f"a row index must be an integer, got {index!r}")
    n = len(tab)
    if not -n <= index < n:
        where = "" if output is None else f" of output {output}"
        raise EquationIndexError(f"row {index} is past the equations table{where}, which has {n} rows "
                                 f"(indices 0..{n - 1})")
    return tab[index] if isinstance(tab, list) else tab.iloc[int(index)]


def per_output(index, n_out: int) -> list:
    """With several outputs: one row index (or None: the selected row) per output."""
    if index is None:
        return [None] * n_out
    if isinstance(index, (str, bytes)) or not hasattr(index, "__len__"):
        raise SRError(f"with {n_out} outputs, index must be a list of {n_out} row indices, one per output "
                      f"(as PySR takes it), got {index!r}")
    index = list(index)
    if len(index) != n_out:
        raise SRError(f"with {n_out} outputs, index must list {n_out} row indices, got {len(index)}: {index!r}")
    return index


def latex(expr: sp.Expr, precision: int | None = None) -> str:
    """LaTeX of a formula. Constants read as the equation text prints them (4.905, not 981/200);
    ``precision``: round floating constants to that many significant digits (PySR's ``precision``),
    None keeps every digit the snapped constants have."""
    if precision is not None and (isinstance(precision, (bool, np.bool_)) or not isinstance(precision, (int, np.integer))
                                  or precision < 1):
        raise SRError(f"precision must be None or a positive integer (significant digits), got {precision!r}")
    e = _decimalise(expr)
    if precision is not None:
        e = e.xreplace({c: sp.Float(float(f"{float(c):.{int(precision)}g}"), int(precision))
                        for c in e.atoms(sp.Float)})
    return sp.latex(e, full_prec=False)
