"""The output head as a formula: compose, expand, refit, snap.

y = y_scale * (sum_v W_v * model_v + b) + y_mean, with model_v = factor_v * program_v and every
sub-MLP replaced by its formula. Expanded, that is a sum of coefficient * monomial terms; the
coefficients are refit by least squares against the model's own output on data, snapped to the
simplest numbers their tolerance allows (wtc.sr.numbers), and zero terms dropped. On 0/1
variables x**k is reduced to x first, so XOR reads x + y - 2xy as the paper reports.
"""
from __future__ import annotations

import numpy as np
import sympy as sp

from wtc import lapack
from wtc.sr import numbers


def boolean_reduce(expr: sp.Expr, binary: set[sp.Symbol]) -> sp.Expr:
    """x**k -> x for symbols known to take only the values 0 and 1."""
    if not binary:
        return expr
    return sp.expand(expr).replace(lambda e: e.is_Pow and e.base in binary and e.exp.is_Integer and e.exp > 0,
                                   lambda e: e.base)


def terms_of(expr: sp.Expr) -> tuple[float, list[tuple[float, sp.Expr]]]:
    """(constant, [(coefficient, monomial), ...]) of an expanded expression."""
    const, out = 0.0, {}
    for term in sp.Add.make_args(sp.expand(expr)):
        coeff, mono = term.as_coeff_Mul()
        if mono == 1:
            const += float(coeff)
        else:
            out[mono] = out.get(mono, 0.0) + float(coeff)
    return const, [(coeff, mono) for mono, coeff in out.items()]


def snap_output(expr: sp.Expr, symbols: list[sp.Symbol], data: dict[str, np.ndarray], target: np.ndarray,
                tol: float, binary: set[sp.Symbol], score=None, slack: float = 0.0,
                widths: tuple[float, ...] = (1.0, 10.0, 100.0)) -> sp.Expr:
    """Refit and snap the coefficients of expr's expanded terms against `target` (flat arrays).

    tol: absolute error the output may carry; a coefficient may move by tol / (rms(term) sqrt(m)),
    times each of `widths` in turn (a network is often less precise than the formula it stands
    for). With `score(pred) -> float` (higher is better) the simplest snapped form (fewest terms,
    then cheapest constants) scoring within `slack` of the best is returned; else the first width.
    """
    expr = boolean_reduce(expr, binary)
    _, terms = terms_of(expr)
    if not terms:
        return sp.nsimplify(float(np.mean(target)))
    args = [data[s.name] for s in symbols]
    columns = []
    for _, mono in terms:
        f = sp.lambdify(symbols, mono, modules=["numpy"])
        with np.errstate(all="ignore"):
            columns.append(np.broadcast_to(np.asarray(f(*args), dtype=np.float64), target.shape))
    F = np.column_stack([np.ones_like(target)] + columns)
    if not np.all(np.isfinite(F)):
        return expr
    monomials = [sp.Integer(1)] + [mono for _, mono in terms]
    options = []
    for k in widths:
        try:
            values, nums = _snap(F, target, tol * k)
        except np.linalg.LinAlgError:   # target or a refit's residual not finite (wtc.lapack)
            return expr
        pred = F @ values
        cost = (int(np.count_nonzero(values)), sum(n.cost if n is not None else 20 for n in nums if n is None or n.value))
        options.append((cost, pred, values, nums))
        if score is None:
            break
    if score is not None:
        scores = [score(pred) for _, pred, _, _ in options]
        best = max(scores)
        options = sorted((opt for opt, sc in zip(options, scores) if sc >= best - slack), key=lambda o: o[0])
    _, _, values, nums = options[0]
    out = sp.Integer(0)
    for j, (value, num) in enumerate(zip(values, nums)):
        if value == 0:
            continue
        coeff = num.sym if num is not None and num.exact else sp.Float(value, 12)
        out += coeff * monomials[j]
    return out


def _snap(F: np.ndarray, target: np.ndarray, tol: float):
    """Snap coefficients one at a time (largest effect first), refitting the rest each time; a term
    whose whole effect is below tol is dropped. Returns (values, Num or None per column)."""
    m = F.shape[1]
    coef = lapack.lstsq(F, target)
    rms = np.sqrt(np.mean(F**2, axis=0)) + 1e-300
    fixed: dict[int, float] = {}
    nums: list = [None] * m
    for j in sorted(range(m), key=lambda i: -abs(coef[i]) * rms[i]):
        rest = [i for i in range(m) if i not in fixed]
        resid = target - sum(F[:, i] * v for i, v in fixed.items()) if fixed else target
        c = lapack.lstsq(F[:, rest], resid)
        value = float(c[rest.index(j)])
        if abs(value) * rms[j] <= tol:
            fixed[j] = 0.0
            continue
        width = tol / (rms[j] * np.sqrt(m))
        num = numbers.simplest_in(value - width, value + width, center=value)
        fixed[j] = float(num.value) if num is not None else value
        nums[j] = num
    return np.array([fixed[j] for j in range(m)]), nums
