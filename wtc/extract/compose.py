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
    return const, list(out.items())


def snap_output(expr: sp.Expr, symbols: list[sp.Symbol], data: dict[str, np.ndarray], target: np.ndarray,
                tol: float, binary: set[sp.Symbol]) -> sp.Expr:
    """Refit and snap the coefficients of expr's expanded terms against `target` (flat arrays).

    tol: absolute error the output may carry; a coefficient may move by tol / (rms(term) sqrt(m)).
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
    coef, *_ = np.linalg.lstsq(F, target, rcond=None)
    rms = np.sqrt(np.mean(F**2, axis=0)) + 1e-300
    m = F.shape[1]
    snapped = []
    free = list(range(m))
    # snap one coefficient at a time (largest effect first), refitting the rest each time
    fixed: dict[int, float] = {}
    order = sorted(range(m), key=lambda j: -abs(coef[j]) * rms[j])
    for j in order:
        rest = [i for i in free if i not in fixed]
        resid = target - sum(F[:, i] * v for i, v in fixed.items()) if fixed else target.copy()
        c, *_ = np.linalg.lstsq(F[:, rest], resid, rcond=None)
        value = float(c[rest.index(j)])
        width = tol / (rms[j] * np.sqrt(m))
        num = numbers.simplest_in(value - width, value + width, center=value)
        fixed[j] = float(num.value) if num is not None else value
        snapped.append((j, num))
    out = sp.Integer(0)
    for j, num in snapped:
        value = num.sym if num is not None and num.exact else sp.Float(fixed[j], 12)
        if value == 0:
            continue
        out += value * (sp.Integer(1) if j == 0 else terms[j - 1][1])
    return out
