"""Selection, the Pareto table and the sympy form of the answer.

- Selected: the smallest complexity among candidates that pass the tolerance, ties by description
  length (digits of the constants), then loss. When none passes, PySR's rule: among candidates whose
  loss is within 1.5x of the most accurate, the highest score; it is reported as not exact.
- Table: the best loss per complexity, kept only when it improves on every simpler row;
  score = -d log(loss) / d complexity against the previous row.
- Sympy: the tree converted with exact rational constants, simplified; polynomials in inputs that
  only take values 0 and 1 are reduced to their multilinear form (x**2 == x on bits), and when all
  inputs are 0/1 any formula (max, min, ...) is replaced by the multilinear polynomial with the
  same truth table: the canonical form of a function on bits.
"""
from __future__ import annotations

import itertools
import math
import numpy as np
import sympy as sp
from sympy.printing.str import StrPrinter

from wtc.sr.expr import FloorDiv, to_sympy
from wtc.sr.fitting import Candidate


class Row:
    """One line of the equations table: complexity, loss, score, whether it passes, and the sympy
    form `expr` with its text `equation`. form: the sympy expression, or a function of no
    arguments that builds it: every fit makes a table and few read it (parity_last2's reading
    spent 0.5 of 2.8 s converting rows nobody printed), so it is built on first use."""

    __slots__ = ("complexity", "loss", "score", "passes", "_form", "_equation")

    def __init__(self, complexity: int, loss: float, score: float, form, passes: bool):
        self.complexity, self.loss, self.score, self.passes = complexity, loss, score, passes
        self._form, self._equation = form, None

    @property
    def expr(self) -> sp.Expr:
        if not isinstance(self._form, sp.Basic):
            self._form = self._form()
        return self._form

    @property
    def equation(self) -> str:
        if self._equation is None:
            self._equation = equation_str(self.expr)
        return self._equation

    def as_dict(self) -> dict:
        return {"complexity": self.complexity, "loss": self.loss, "score": self.score,
                "equation": self.equation, "passes": self.passes}

    def __reduce__(self):        # pickled with its form built (a builder is a closure)
        return Row, (self.complexity, self.loss, self.score, self.expr, self.passes)

    def __repr__(self) -> str:
        return (f"Row(complexity={self.complexity}, loss={self.loss!r}, score={self.score!r}, "
                f"equation={self.equation!r}, passes={self.passes})")


def choose(cands: list[Candidate], max_complexity: int) -> Candidate:
    ok = [c for c in cands if c.complexity <= max_complexity] or list(cands)
    passing = [c for c in ok if c.passes]
    if passing:
        return min(passing, key=lambda c: (c.complexity, c.dl, c.rmse))
    front = pareto(ok)
    best_loss = min(c.loss for c in front)
    scores = _scores(front)
    eligible = [(s, c) for s, c in zip(scores, front) if c.loss <= 1.5 * best_loss + 1e-300]
    return max(eligible, key=lambda sc: (sc[0], -sc[1].complexity))[1]


def pareto(cands: list[Candidate]) -> list[Candidate]:
    """Best candidate per complexity that beats all simpler ones, by increasing complexity."""
    by_c: dict[int, Candidate] = {}
    for c in cands:
        cur = by_c.get(c.complexity)
        if cur is None or (c.rmse, c.dl) < (cur.rmse, cur.dl):
            by_c[c.complexity] = c
    out, best = [], math.inf
    for k in sorted(by_c):
        c = by_c[k]
        if c.rmse < best * (1 - 1e-9) or not out:
            out.append(c)
            best = min(best, c.rmse)
    return out


def _scores(front: list[Candidate]) -> list[float]:
    out, prev = [], None
    for c in front:
        if prev is None:
            out.append(0.0)
        else:
            l0, l1 = max(prev.loss, 1e-300), max(c.loss, 1e-300)
            out.append(-(math.log(l1) - math.log(l0)) / max(c.complexity - prev.complexity, 1))
        prev = c
    return out


def table(cands: list[Candidate], symbols, binary_syms, max_complexity: int) -> list[Row]:
    front = pareto([c for c in cands if c.complexity <= max_complexity] or cands)
    rows = []
    for c, s in zip(front, _scores(front)):
        rows.append(Row(c.complexity, c.loss, s, _row_form(c.tree, symbols, binary_syms), c.passes))
    return rows


def _row_form(tree, symbols, binary_syms):
    return lambda: sympy_form(tree, symbols, binary_syms, simplify=False)


# ---------------------------------------------------------------------------------- sympy
def sympy_form(tree, symbols, binary_syms=(), simplify: bool = True, nonneg=()) -> sp.Expr:
    # inputs are real numbers: simplify with real symbols (sqrt(exp(-x)) -> exp(-x/2)), then
    # hand back the plain symbols the caller knows; inputs never negative on the data are
    # simplified as such (sqrt(b**2*(a**2 + 1)) -> b*sqrt(a**2 + 1), not Abs(b)*...)
    real = {s: sp.Symbol(s.name, real=True, nonnegative=True if s in nonneg else None) for s in symbols}
    back = {v: k for k, v in real.items()}
    e = to_sympy(tree, [real[s] for s in symbols])
    if simplify and safe_to_simplify(e):
        try:
            s = sp.simplify(e)
            if sp.count_ops(s) < sp.count_ops(e):
                e = s
        except Exception:  # simplification is cosmetic: never lose the answer to it
            pass
    return multilinear(e.xreplace(back), binary_syms)


def safe_to_simplify(e: sp.Expr) -> bool:
    """sympy.simplify runs out of memory on cos(86000000*x) (a formula fitted in scaled units and
    mapped back): not on expressions with rationals past a million inside a function."""
    for f in e.atoms(sp.Function):
        for r in f.atoms(sp.Rational):
            if abs(r.p) > 10**6 or r.q > 10**6:
                return False
    return sp.count_ops(e) < 60


def multilinear(e: sp.Expr, binary_syms) -> sp.Expr:
    """On inputs that are 0/1, x**n == x: reduce polynomials to the canonical multilinear form."""
    bs = [s for s in binary_syms if s in e.free_symbols]
    if not bs or not e.is_polynomial(*bs):
        return e
    ex = sp.expand(e)
    red = ex.replace(lambda a: a.is_Pow and a.base in bs and a.exp.is_Integer and a.exp > 0,
                     lambda a: a.base)
    return sp.expand(red)


def _decimalise(e: sp.Expr) -> sp.Expr:
    """Rationals with a power-of-ten-like denominator (>= 10) as floats, for printing only."""
    reps = {}
    for r in e.atoms(sp.Rational):
        q = int(r.q)
        qq = q
        for f in (2, 5):
            while qq % f == 0:
                qq //= f
        if qq == 1 and q >= 10:
            reps[r] = sp.Float(float(r), 15)
    return e.xreplace(reps) if reps else e


_RESIDUES = (sp.Mod, FloorDiv)


class _Printer(StrPrinter):
    """sympy's text, with Mod written as Python writes it: x % 3."""

    def _print_Mod(self, expr):
        a, b = expr.args
        return f"{self.parenthesize(a, 50)} % {self.parenthesize(b, 51)}"

    # a residue or quotient that is a factor: 0.32*(s % 15), -(s % 15), 2*(s // 15), (s % 7)**2
    # (sympy writes 0.32*s % 15 and -s % 15, which Python reads as (0.32*s) % 15 and (-s) % 15)
    _in_product = False

    def _print_Mul(self, expr):
        outer, self._in_product = self._in_product, any(isinstance(f, _RESIDUES) for f in expr.args)
        try:
            return super()._print_Mul(expr)
        finally:
            self._in_product = outer

    def parenthesize(self, item, level, strict=False):
        if isinstance(item, _RESIDUES) and (self._in_product or level >= 60):     # 60: a power's base
            return f"({self._print(item)})"
        return super().parenthesize(item, level, strict)


def equation_str(e: sp.Expr) -> str:
    """Readable text: short decimals (4.905) instead of 981/200, floats at their own precision."""
    printer = _Printer({"full_prec": False})
    attempts = (lambda: printer.doprint(_decimalise(e)),
                # a constant with thousands of digits (exp of a large rational, 10**5000)
                lambda: printer.doprint(e.xreplace({n: sp.Float(n, 6) for n in e.atoms(sp.Rational)})),
                lambda: printer.doprint(e.evalf(6)))
    for attempt in attempts:
        try:
            return attempt()
        except (ValueError, OverflowError, TypeError):
            continue
    return "<formula whose constants are too large to print>"


def max_abs_err(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.max(np.abs(pred - y))) if len(y) else 0.0


def boolean_canonical(e: sp.Expr, symbols) -> sp.Expr:
    """The multilinear polynomial equal to e on {0,1}^k (Moebius transform of its truth table)."""
    k = len(symbols)
    values = {}
    for bits in itertools.product((0, 1), repeat=k):
        v = sp.nsimplify(e.subs(dict(zip(symbols, bits))))
        if not v.is_finite:
            return e
        values[bits] = v
    out = sp.Integer(0)
    for S in itertools.product((0, 1), repeat=k):
        coef = sum(((-1) ** (sum(S) - sum(T))) * values[T]
                   for T in itertools.product((0, 1), repeat=k) if all(t <= s_ for t, s_ in zip(T, S)))
        coef = sp.nsimplify(coef)
        if coef != 0:
            out += coef * sp.Mul(*[x for x, bit in zip(symbols, S) if bit])
    return sp.expand(out)


def sympy_size(e: sp.Expr) -> int:
    """Node count of a sympy expression in the tree convention of wtc.sr.expr (binary + - * /,
    unary functions, x**2 one node, constants and symbols one each)."""
    if e.is_Atom:
        return 1
    if e.is_Add or e.is_Mul:
        args = [a for a in e.args if not (e.is_Mul and a == -1)]  # a factor -1 folds into a minus
        return sum(sympy_size(a) for a in args) + len(args) - 1
    if e.is_Pow:
        return sympy_size(e.base) + (1 if e.exp == 2 else 1 + sympy_size(e.exp))
    return 1 + sum(sympy_size(a) for a in e.args)
