"""PySR behind the same interface: used only when PySR and a Julia installation are present.

Importing ``pysr`` starts Julia through juliacall and, when Julia is missing, tries to download it.
So availability is decided without importing it: the ``pysr`` and ``juliacall`` modules must be
installed and a Julia executable must already exist (``PYTHON_JULIAPKG_EXE``, ``julia`` on PATH, or
the juliapkg install inside the Python environment). Only then is PySR imported, at fit time.
PySR's Pareto front is re-scored with this package's tolerance so that ``exact`` means the same
thing for both backends.
"""
from __future__ import annotations

from wtc.errors import WtcError

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import sympy as sp

from wtc.sr.api import Fit
from wtc.sr.data import TOL_FACTOR, check_inputs, check_weights, prepare, weighted_points
from wtc.sr.pareto import Row, equation_str

MAX_INPUTS = 50  # PySR itself has no small limit; keep inputs sane
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "max": "max", "min": "min"}
_UNARY = {"sq": "square", "abs": "abs", "relu": "relu", "neg": "neg", "sqrt": "sqrt", "exp": "exp",
          "log": "log", "sin": "sin", "cos": "cos", "tanh": "tanh"}


class BackendUnavailable(WtcError, RuntimeError):
    """backend='pysr' was requested but PySR or Julia is missing; the message says which."""


def julia_executable() -> str | None:
    exe = os.environ.get("PYTHON_JULIAPKG_EXE")
    if exe and Path(exe).is_file():
        return exe
    exe = shutil.which("julia")
    if exe:
        return exe
    for cand in Path(sys.prefix).glob("julia_env/pyjuliapkg/install/bin/julia*"):
        if cand.is_file():
            return str(cand)
    return None


def availability() -> tuple[bool, str]:
    """(usable, what is missing) -- without importing pysr."""
    missing = []
    if importlib.util.find_spec("pysr") is None:
        missing.append("the 'pysr' package (pip install 'wtc[pysr]')")
    if importlib.util.find_spec("juliacall") is None:
        missing.append("the 'juliacall' package (installed with pysr)")
    if julia_executable() is None:
        missing.append("a Julia installation (put 'julia' on PATH or set PYTHON_JULIAPKG_EXE; "
                       "importing PySR without it would try to download Julia)")
    return (not missing), "; ".join(missing)


def fit_pysr(X, y, names=None, tol=None, *, max_complexity=20, operators=None, time_limit=None,
             random_state=0, sample_weight=None) -> Fit:
    X, y, names = check_inputs(X, y, names, max_inputs=MAX_INPUTS)
    weights = None
    if sample_weight is not None:   # as the builtin engine: weight-0 points out, the rest mean 1
        X, y, weights = weighted_points(X, y, check_weights(sample_weight, len(y)))
    w = np.ones(len(y)) if weights is None else weights
    ok, missing = availability()
    if not ok:
        raise BackendUnavailable(f"backend='pysr' is not usable here: missing {missing}. "
                                 "Use backend='builtin'.")
    rng = np.random.default_rng(random_state)
    data = prepare(X, y, names, tol, rng, weights)
    from pysr import PySRRegressor  # starts Julia: only here

    binary, unary = _pysr_operators(operators)
    model = PySRRegressor(
        maxsize=max(int(max_complexity), 7), binary_operators=binary, unary_operators=unary,
        timeout_in_seconds=time_limit, random_state=random_state, deterministic=True,
        parallelism="serial", progress=False, verbosity=0, model_selection="best",
    )
    model.fit(X, y, weights=weights, variable_names=list(names))
    syms = tuple(sp.Symbol(s) for s in names)
    table = model.equations_
    rows, best, best_key = [], None, None
    for _, r in table.iterrows():
        e = sp.sympify(r["sympy_format"]).xreplace({sp.Symbol(s): sym for s, sym in zip(names, syms)})
        pred = _evaluate(e, syms, X)
        rmse = float(np.sqrt(np.mean(w * (y - pred) ** 2))) if np.all(np.isfinite(pred)) else np.inf
        passes = rmse <= data.thr
        row = Row(int(r["complexity"]), rmse**2, float(r.get("score", 0.0)), equation_str(e), e, passes)
        rows.append(row)
        key = (not passes, row.complexity if passes else 0, rmse)
        if best_key is None or key < best_key:
            best, best_key = (row, pred), key
    row, pred = best
    resid = y - pred
    sst = float(np.sum(w * (y - np.average(y, weights=w)) ** 2))
    sse = float(np.sum(w * resid**2))
    return Fit(expr=row.expr, equation=row.equation, exact=bool(row.passes), complexity=row.complexity,
               loss=sse / len(y), rmse=float(np.sqrt(sse / len(y))), max_abs_err=float(np.max(np.abs(resid))),
               r2=1.0 - sse / sst if sst > 0 else float(sse == 0), tolerance=data.thr,
               noise=data.sigma if data.sigma_method != "tol" else data.sigma * TOL_FACTOR,
               noise_method=data.sigma_method, candidates=rows, names=names,
               operators=tuple(binary) + tuple(unary), backend="pysr")


def _pysr_operators(operators):
    from wtc.sr.expr import resolve_ops
    if operators is None or operators == "auto":
        return ["+", "-", "*", "/", "max", "min"], ["square", "abs", "sqrt", "exp", "log", "sin", "cos", "tanh"]
    ops = resolve_ops(operators)
    binary = ["+", "-", "*"] + [_BINARY[o] for o in ops if o in _BINARY and _BINARY[o] not in "+-*"]
    unary = [_UNARY[o] for o in ops if o in _UNARY]
    return binary, unary


def _evaluate(e, syms, X):
    f = sp.lambdify(syms, e, modules="numpy")
    with np.errstate(all="ignore"):
        out = f(*[X[:, i] for i in range(X.shape[1])])
    return np.broadcast_to(np.asarray(out, dtype=np.float64), (len(X),))
