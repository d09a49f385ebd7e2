"""The functional entry point: ``fit(X, y, names=..., tol=...) -> Fit``."""
from __future__ import annotations

from dataclasses import dataclass, field

import time

import numpy as np
import sympy as sp

from wtc.sr import search
from wtc.sr.data import (REL_FLOOR, TOL_FACTOR, check_inputs, check_tol, check_weights, prepare, weighted_points,
                         weighted_sample)
from wtc.sr.expr import evaluate, to_str, uses_integer_ops
from wtc.sr.noise_level import STRUCTURE_Z, neighbour_index, residual_structure
from wtc.sr.pareto import (Row, boolean_canonical, choose, equation_str, safe_to_simplify, sympy_form,
                           sympy_size, table)
from wtc.arguments import no_unknown_keywords
from wtc.errors import SRError

DEFAULT_MAX_COMPLEXITY = 20
MAX_COMPLEXITY = 60  # the screen's tables grow with it; no enumeration reaches past ~15 nodes a term
MAX_TIME_LIMIT = 7 * 24 * 3600.0


@dataclass
class Fit:
    """The answer of a symbolic regression.

    expr         simplified sympy expression over the input names (exact rational constants)
    equation     readable text of expr (short decimals: 100 - 4.905*t**2)
    exact        True when the formula meets the tolerance: its rmse over all points is at most
                 ``tolerance`` (then it is the simplest such formula found)
    complexity   node count of the formula (constants, variables and operators), as found; on 0/1
                 inputs, of the multilinear form returned
    loss, rmse   mean squared error and its root over all points (weighted means when fitted with
                 sample_weight); max_abs_err (over the points of positive weight), r2 likewise
    tolerance    the absolute rmse a formula had to reach; noise (std) and noise_method say where
                 it came from ('tol' when given, else 'replicates' or 'local-quadratic')
    candidates   the Pareto table (list of Row: complexity, loss, score, equation, expr, passes)
    operators    the operator set of the last level searched
    note         why the answer is not exact (or other caveats), '' when nothing to say
    """
    expr: sp.Expr
    equation: str
    exact: bool
    complexity: int
    loss: float
    rmse: float
    max_abs_err: float
    r2: float
    tolerance: float
    noise: float
    noise_method: str
    candidates: list = field(repr=False)
    names: tuple = ()
    operators: tuple = ()
    seconds: float = 0.0
    timed_out: bool = False
    backend: str = "builtin"
    note: str = ""
    tree: tuple | None = field(default=None, repr=False)

    def predict(self, X) -> np.ndarray:
        """Evaluate the formula on X (n, k) or (n,)."""
        try:
            if np.iscomplexobj(X):
                raise SRError("X is complex; the formula is evaluated on real numbers")
            X = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, SRError):
                raise
            raise SRError(f"X must be a numeric array, got {type(exc).__name__}: {exc}") from None
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2 or X.shape[1] != len(self.names):
            raise SRError(f"X must have shape (n, {len(self.names)}), got {X.shape}")
        syms = tuple(sp.Symbol(s) for s in self.names)
        f = sp.lambdify(syms, self.expr, modules="numpy", dummify=True)
        with np.errstate(all="ignore"):
            out = f(*[X[:, i] for i in range(X.shape[1])])
        return np.broadcast_to(np.asarray(out, dtype=np.float64), (len(X),)).copy()

    def __str__(self) -> str:
        flag = "exact" if self.exact else "NOT within tolerance"
        return (f"{self.equation}   [{flag}; complexity {self.complexity}, rmse {self.rmse:.3g}, "
                f"max|err| {self.max_abs_err:.3g}, tolerance {self.tolerance:.3g}]")


MAX_MODULUS = 10**6

FIT_ARGUMENTS = ("X", "y", "names", "tol", "max_complexity", "operators", "time_limit", "random_state",
                 "sample_weight", "moduli")


class SRArgumentError(SRError, TypeError):
    """An argument wtc.sr does not take (a typo, or a scikit-learn option it does not implement)."""


def fit(X, y, names=None, tol: float | None = None, *, max_complexity: int = DEFAULT_MAX_COMPLEXITY,
        operators=None, time_limit: float | None = None, random_state: int | None = 0, sample_weight=None,
        moduli=(), **unknown) -> Fit:
    """Find the simplest formula y = f(X) within the tolerance. See ``wtc.sr`` for details.

    ``sample_weight`` (n,): each point's share of the loss (weighted least squares throughout the
    search and the refits; points of weight 0 are left out). The noise estimate behind the
    default tolerance and the every-point check treat the kept points alike.

    ``moduli``: whole numbers the integer operators may also take as their right operand (by
    default 0 and 2..10): `s % 15` is then a formula of an integer s."""
    started = time.perf_counter()       # the time limit covers the whole fit, data preparation too
    no_unknown_keywords("wtc.sr.fit() has no argument", unknown, FIT_ARGUMENTS, SRArgumentError)
    X, y, names = check_inputs(X, y, names)
    weights = None
    if sample_weight is not None:
        X, y, weights = weighted_points(X, y, check_weights(sample_weight, len(y)))
    check_options(max_complexity=max_complexity, time_limit=time_limit, random_state=random_state, tol=tol,
                  operators=operators)
    moduli = check_moduli(moduli)
    rng = np.random.default_rng(random_state)
    X_user, y_user = X, y
    scales = _decade_scales(X, y)
    sy = float(scales[1]) if scales else 1.0
    if scales:           # fit in units of powers of ten, map the formula back exactly (below)
        X, y = X / np.array([float(v) for v in scales[0]]), y / sy
    data = prepare(X, y, names, tol, rng, weights)
    levels = search.op_levels(operators, data.integer)  # validates the operator names before any work
    left = None if time_limit is None else max(time_limit - (time.perf_counter() - started), 1e-3)
    cands, log = search.run(data, max_complexity=int(max_complexity), operators=operators,
                            time_limit=left, rng=rng, moduli=moduli)
    best = choose(cands, int(max_complexity))
    structured = ""
    if best.passes and data.sigma_method == "local-quadratic" and data.sigma > REL_FLOOR * data.y_rms:
        best, structured = _unstructured(best, cands, data, int(max_complexity), rng)
    syms = tuple(sp.Symbol(s) for s in names)
    binary = [syms[i] for i in data.binary]
    nonneg = [syms[i] for i in range(len(syms)) if float(np.min(X[:, i])) >= 0]
    expr = sympy_form(best.tree, syms, binary, nonneg=nonneg)
    complexity = best.complexity
    if len(binary) == len(syms) and best.passes:
        # on bits: the multilinear canonical form, counted as written (xor reads a + b - 2*a*b, as
        # the Discrete Transformer paper reports), unless an integer reading is at most half its
        # size: (a + b + c >= 2) for 19 nodes of polynomial, (a + b + c) % 2 for 30
        plain = [c for c in cands if c.passes and c.complexity <= max_complexity and not uses_integer_ops(c.tree)]
        ints = [c for c in cands if c.passes and c.complexity <= max_complexity and uses_integer_ops(c.tree)]
        base = min(plain, key=lambda c: (c.complexity, c.dl, c.rmse)) if plain else best
        canon = boolean_canonical(sympy_form(base.tree, syms, binary), syms)
        alt = min(ints, key=lambda c: (c.complexity, c.dl, c.rmse)) if ints else None
        if alt is not None and (not plain or 2 * alt.complexity <= sympy_size(canon)):
            best = alt
            expr, complexity = sympy_form(alt.tree, syms, binary), alt.complexity
        else:
            best = base
            expr, complexity = canon, sympy_size(canon)
    elif len(binary) == len(syms):
        expr = boolean_canonical(expr, syms)
        complexity = sympy_size(expr)
    rows = table(cands, syms, binary, int(max_complexity))
    tree = best.tree
    if scales:
        expr, rows, tree = _unscale(expr, syms, scales), [_unscale_row(r, syms, scales) for r in rows], None
        X, y = X_user, y_user
        with np.errstate(all="ignore"):
            pred = np.broadcast_to(np.asarray(sp.lambdify(syms, expr, modules="numpy")(*X.T), np.float64), y.shape)
    else:
        pred = np.broadcast_to(evaluate(best.tree, [X[:, i] for i in range(X.shape[1])]), y.shape)
    resid = y - pred
    with np.errstate(over="ignore"):   # at |y| ~ 1e300 the squares are inf: r2 is then nan, not an error
        if weights is None:
            sst, sse = float(np.sum((y - y.mean()) ** 2)), float(np.sum(resid**2))
        else:                           # weights have mean 1: sse / len(y) is the weighted mse
            sst = float(np.sum(weights * (y - np.average(y, weights=weights)) ** 2))
            sse = float(np.sum(weights * resid**2))
    thr = data.thr * sy
    max_err = float(np.max(np.abs(resid)))
    # judged as the weighted loss sees each point: sqrt(w_i) |r_i| (max_err itself stays plain)
    max_judged = max_err if weights is None else float(np.max(np.sqrt(weights) * np.abs(resid)))
    rmse = float(np.sqrt(sse / len(y)))
    # judged again on every point in the user's units (the search saw at most MAX_FIT_POINTS)
    on_all = rmse <= thr * (1 + 1e-9) and max_judged <= data.max_err_allowed * sy * (1 + 1e-9)
    exact = bool(best.passes) and on_all and not data.warning and not structured
    if data.warning:
        note = data.warning
    elif structured:
        note = structured
    elif exact:
        note = ""
    elif best.passes:
        note = (f"the formula is within the tolerance on the fitting points but not on all points "
                f"(rmse {rmse:.3g}, max |err| {max_judged:.3g}; allowed {thr:.3g} and {data.max_err_allowed * sy:.3g})")
    else:
        note = (f"no formula up to complexity {max_complexity} reaches the tolerance "
                f"(rmse <= {thr:.3g} and |err| <= {data.max_err_allowed * sy:.3g} on every point); "
                "this is the best trade-off found")
    if data.note:
        note = (note + "; " if note else "") + data.note
    if any(m > search.INT_CONST_MAX for m in moduli) and not data.integer:   # said, not dropped silently
        why = "inputs above 1e4 were rescaled by powers of ten" if scales and any(v != 1 for v in scales[0]) else \
            "the inputs and y are not both whole numbers"
        note = (note + "; " if note else "") + f"moduli unused: the integer operators need whole numbers ({why})"
    total = time.perf_counter() - started
    if time_limit is not None and total > time_limit * 1.05 + 0.5:
        note = (note + "; " if note else "") + (f"time limit ({time_limit} s) overrun: the fit took {total:.1f} s "
                                               f"(search {log.seconds:.1f} s)")
    elif log.timed_out:
        note = (note + "; " if note else "") + f"time limit ({time_limit} s) reached: search incomplete"
    return Fit(
        expr=expr, equation=equation_str(expr), exact=exact, complexity=complexity,
        loss=sse / len(y), rmse=rmse,
        max_abs_err=max_err, r2=1.0 - sse / sst if sst > 0 else float(sse == 0),
        tolerance=thr, noise=data.sigma if data.sigma_method != "tol" else data.sigma * TOL_FACTOR,
        noise_method=data.sigma_method, candidates=rows,
        names=names, operators=log.levels_tried[-1] if log.levels_tried else levels[0],
        seconds=total, timed_out=log.timed_out or (time_limit is not None and total > time_limit), note=note,
        tree=tree,
    )


def _unstructured(best, cands, data, max_complexity: int, rng):
    """The tolerance came from a local noise estimate, which reads structure it cannot resolve
    (x + 0.3 * (x % 2) on integers) as noise: a passing formula must also leave residuals that look
    like noise. Returns the simplest passing candidate that does, else (best, why not exact)."""
    # under sample weights: the fitting points drawn as the noise estimate drew its points
    among = weighted_sample(data.wf, rng) if data.weighted else np.arange(len(data.yf))
    index = neighbour_index(data.Xf[among], rng)
    cols = data.cols("fit")
    passing = sorted((c for c in cands if c.passes and c.complexity <= max_complexity),
                     key=lambda c: (c.complexity, c.dl, c.rmse))
    first_z = None
    for c in passing[:20]:
        pred = np.broadcast_to(evaluate(c.tree, cols), data.yf.shape)
        z = residual_structure((data.yf - pred)[among], index)
        if z <= STRUCTURE_Z:
            return c, ""
        first_z = z if first_z is None else first_z
    return best, (f"the formula is within the estimated noise, but its residuals are not noise: neighbouring "
                  f"points predict them (z = {first_z:.1f}), so the data have structure the noise estimate "
                  "absorbed; not certified (pass tol to accept this error level)")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def check_moduli(moduli) -> tuple[int, ...]:
    """moduli: whole numbers >= 2 that the integer operators (%, //, >=, ==) may take as their right
    operand beyond the default 0, 2..10 (the periods of a model's units, say); None is none; refused by name."""
    if moduli is None:
        return ()
    want = f"moduli must be a sequence of whole numbers in [2, {MAX_MODULUS}]"
    if isinstance(moduli, (str, bytes)) or not hasattr(moduli, "__iter__") or np.ndim(moduli) == 0:
        raise SRError(f"{want}, got {moduli!r}")
    out = tuple(moduli)
    bad = [m for m in out if not _is_int(m) or not 2 <= m <= MAX_MODULUS]
    if bad:
        raise SRError(f"{want}, got {bad[0]!r} in {moduli!r}")
    return tuple(int(m) for m in out)


def check_options(*, max_complexity, time_limit, random_state, tol, operators) -> None:
    """Refuse search options that cannot be used, naming the argument and the allowed range."""
    if not _is_int(max_complexity) or not 1 <= max_complexity <= MAX_COMPLEXITY:
        raise SRError(f"max_complexity must be an integer in [1, {MAX_COMPLEXITY}], got {max_complexity!r}")
    if time_limit is not None and (not _is_real(time_limit) or not 0 < time_limit <= MAX_TIME_LIMIT):
        raise SRError(f"time_limit must be None or seconds in (0, {MAX_TIME_LIMIT:.0f}], got {time_limit!r}")
    if random_state is not None and (not _is_int(random_state) or random_state < 0):
        raise SRError(f"random_state must be None or a non-negative integer, got {random_state!r}")
    if tol is not None:
        check_tol(tol)
    if operators is not None and not isinstance(operators, str):
        try:
            ops = list(operators)
        except TypeError:
            raise SRError(f"operators must be None, 'auto' or a list of operator names, got {operators!r}") from None
        bad = [o for o in ops if not isinstance(o, str)]
        if bad:
            raise SRError(f"operators must be names (strings), got {bad[0]!r} in {operators!r}")
        if not ops:    # an empty list would still search the basic arithmetic: say what it means
            raise SRError("operators is an empty list; pass None (or 'auto') for the default set, or name the "
                          "operators to use")


# Magnitudes the enumeration handles directly; beyond them the data are rescaled by powers of ten
# (candidate values above 1e12 are dropped as near-singular, and exact-rational snapping of
# constants like 1e-200 overflows), so y = x fits at 1e15 as well as at 1.
SAFE_MAGNITUDE = (1e-3, 1e4)


def _decade(v: np.ndarray) -> sp.Rational:
    top = float(np.max(np.abs(v))) if v.size else 0.0
    if top == 0.0 or SAFE_MAGNITUDE[0] <= top <= SAFE_MAGNITUDE[1]:
        return sp.Integer(1)
    return sp.Integer(10) ** int(np.floor(np.log10(top)))


def _decade_scales(X: np.ndarray, y: np.ndarray):
    """(column scales, y scale) as exact powers of ten, or None when every magnitude is safe."""
    sx = [_decade(X[:, i]) for i in range(X.shape[1])]
    sy = _decade(y)
    return None if all(s == 1 for s in sx) and sy == 1 else (sx, sy)


def _unscale(expr: sp.Expr, syms, scales) -> sp.Expr:
    """y/sy = g(x/sx)  ->  y = sy * g(x / sx), the powers of ten exact, so y = x comes back as x."""
    sx, sy = scales
    out = sy * expr.subs({s: s / e for s, e in zip(syms, sx)}, simultaneous=True)
    out = sp.expand(out)
    return sp.simplify(out) if safe_to_simplify(out) else out


def _unscale_row(row: Row, syms, scales) -> Row:
    with np.errstate(over="ignore"):   # a loss past 1e308 is inf, not an OverflowError
        loss = float(np.float64(row.loss) * np.float64(float(scales[1])) ** 2) if row.loss else 0.0
    return Row(row.complexity, loss, row.score, lambda: _unscale(row.expr, syms, scales), row.passes)


__all__ = ["Fit", "Row", "fit", "to_str"]
