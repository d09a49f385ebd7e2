"""Formulas for extraction: the simplest formula of a module's inputs within a tolerance
(wtc.sr, widened step by step), and for integer outputs the simplest that keeps the model's
decisions (used by wtc.extraction.reader)."""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import time

import numpy as np
import sympy as sp

from wtc import sr
from wtc.errors import WtcError

MIN_DECISION_AGREEMENT = 0.8  # integer outputs: a formula must share this share of the model's decisions
DECISION_SLACK = 0.05         # ... and may trail the best candidate's agreement by this much
MAX_SR_POINTS = 3000
FEWER_TIME_LIMIT = 20.0       # seconds for all the regressions of integral_formula


class ExtractionError(WtcError, RuntimeError):
    """A step of the extraction could not run (not: could not find a rule or formula)."""


class ExtractionTimeout(ExtractionError):
    """The reading's deadline passed before every module was read (extract(..., deadline=))."""


# time.time() by which the reading in progress must end (None: no limit); set by extract(deadline=)
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("wtc_extraction_deadline", default=None)


@contextlib.contextmanager
def reading_deadline(deadline: float | None):
    """Every regression inside the block gets at most the time left before `deadline`."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _time_limit(time_limit: float | None) -> float | None:
    """The regression's time limit under the reading's deadline; ExtractionTimeout once it passed."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return time_limit
    left = deadline - time.time()
    if left <= 0:
        raise ExtractionTimeout("the time budget ran out while reading the model (extract's deadline)")
    return left if time_limit is None else min(time_limit, left)


def formula(X: np.ndarray, y: np.ndarray, names: tuple[str, ...], tol_abs: float, widen=(1.0, 3.0, 10.0),
             time_limit: float | None = None, decisions: bool = False, moduli: tuple[int, ...] = ()):
    """Simplest formula y = f(X) within tol_abs (rms), widening the tolerance if nothing passes.

    decisions=True (integer outputs, y = the model's rounded outputs): among the regression's
    Pareto candidates, the simplest whose rounded values agree with y (weighted by how often each
    input occurs) within DECISION_SLACK of the best agreement any candidate reaches: a network that
    rounds wrong on a few inputs must not buy a formula that copies its wobble (seen: x*y plus
    sin/cos terms at +0.5% agreement on product_last2).
    moduli: extra right operands of %, // and the comparisons (wtc.sr.fit), a model's periods.
    Returns (sympy expression, evidence text, passed)."""
    if X.shape[1] == 0:
        value = float(np.mean(y))
        ok = float(np.sqrt(np.mean((y - value) ** 2))) <= tol_abs
        return sp.nsimplify(value, rational=True, tolerance=tol_abs), "constant", ok
    X, inverse, counts = np.unique(np.round(X, 12), axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    y = np.bincount(inverse, weights=y) / counts                                  # mean per distinct input
    if decisions:
        y = np.round(y)
    if len(y) > MAX_SR_POINTS:
        pick = np.random.default_rng(0).choice(len(y), MAX_SR_POINTS, replace=False)
        X, y, counts = X[pick], y[pick], counts[pick]
    if len(y) < 8:   # e.g. two bits: 4 distinct inputs; repeat them so the regression has its minimum
        reps = -(-8 // len(y))
        X, y, counts = np.tile(X, (reps, 1)), np.tile(y, reps), np.tile(counts, reps) / reps
    fit = sr_fit(X, y, names, tol_abs, widen, time_limit, moduli)
    evidence = f"rmse {fit.rmse:.3g} (tolerance {fit.tolerance:.3g}), R^2 {fit.r2:.6f}, complexity {fit.complexity}"
    if not decisions:
        return fit.expr, evidence, bool(fit.exact)
    symbols = [sp.Symbol(n) for n in names]
    scored = []
    for row in sorted(fit.candidates, key=lambda r: r.complexity):
        f = sp.lambdify(symbols, row.expr, modules=["numpy"])
        with np.errstate(all="ignore"):
            pred = np.broadcast_to(np.asarray(f(*X.T), dtype=float), y.shape)
        agree = float(np.sum(counts * (np.round(pred) == y)) / np.sum(counts))
        scored.append((row, agree))
    if not scored:
        return fit.expr, evidence, bool(fit.exact)
    best = max(a for _, a in scored)
    row, agree = next((r, a) for r, a in scored if a >= best - DECISION_SLACK)
    evidence = (f"agrees with the model's decisions on {agree:.4f} of inputs (best candidate {best:.4f}); "
                f"complexity {row.complexity}")
    return row.expr, evidence, agree >= MIN_DECISION_AGREEMENT


def sr_fit(X, y, names, tol_abs, widen, time_limit=None, moduli=()):
    """wtc.sr.fit at tol_abs (absolute rms), widened step by step until a formula passes."""
    rms = float(np.sqrt(np.mean(y**2))) + 1e-12
    fit = None
    for w in widen:
        limit = _time_limit(time_limit)
        try:
            fit = sr.fit(X, y, names=names, tol=min(1.0, w * tol_abs / rms), time_limit=limit, moduli=moduli)
        except (ValueError, OverflowError, ZeroDivisionError) as exc:
            if fit is not None:      # keep the last good answer; nothing wider will be simpler
                break
            raise ExtractionError(f"symbolic regression over {names} failed: {exc}") from exc
        if fit.exact:
            break
    return fit


def values_of(expr: sp.Expr, columns: dict[str, np.ndarray], shape) -> np.ndarray | None:
    """expr evaluated on the columns its symbols name (None if one is not among them)."""
    names = sorted(str(s) for s in expr.free_symbols)
    if any(n not in columns for n in names):
        return None
    f = sp.lambdify([sp.Symbol(n) for n in names], expr, modules=["numpy"])
    with np.errstate(all="ignore"):
        return np.broadcast_to(np.asarray(f(*[columns[n] for n in names]), dtype=float), shape)


def integral_formula(columns: dict[str, np.ndarray], target: np.ndarray, tol_abs: float, widen=(1.0, 3.0, 6.0),
                     min_agreement: float = 1.0, max_size: int = 2, time_limit: float = FEWER_TIME_LIMIT,
                     moduli: tuple[int, ...] = ()):
    """An integer output read over fewer of the variables it reads, as a formula whose values are
    its decisions (whole numbers, every one the model's): `Mod(s, 2)` of a prefix sum s where the
    regression over s, the mean beside it and the routed bit returned |cos(1.6 s + 1.41)|, right
    on the lengths seen and wrong beyond them. Subsets are tried smallest first (one variable,
    then two, up to max_size and fewer than all), and among those of the smallest size that pass,
    the simplest formula wins; the regressions together take at most time_limit seconds (the
    subsets not reached by then are not tried). Returns (expr, evidence) or None."""
    names = list(columns)
    found = []
    end = time.time() + time_limit
    for size in range(1, min(max_size, len(names) - 1) + 1):
        for subset in itertools.combinations(names, size):
            left = end - time.time()
            if left <= 0:
                break
            X = np.stack([columns[n] for n in subset], axis=1)
            expr, _, ok = formula(X, target, subset, tol_abs, widen=widen, decisions=True, time_limit=left,
                                  moduli=moduli)
            if not ok:
                continue
            values = values_of(expr, columns, target.shape)
            agree = float(np.mean(values == target))
            if np.array_equal(values, np.round(values)) and agree >= min_agreement:
                found.append((sp.count_ops(expr), expr, agree))
        if found:
            _, expr, agree = min(found, key=lambda c: c[0])
            return expr, f"its values are the model's decisions on {agree:.4f} of inputs, whole numbers"
    return None
