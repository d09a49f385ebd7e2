"""Snapping fitted constants to the simplest number a person would write.

Given an estimate ``theta`` and its standard error, :func:`simplest_in` returns the cheapest
number inside ``[theta - z*se, theta + z*se]``, where the cost is the count of digits one writes:
0 and small integers, short decimals (4.905, 9.81), small fractions (1/3, 7/9 via Stern-Brocot),
and small rational multiples of pi, e, sqrt(2), sqrt(3), log(2) and log(10). A constant that
cannot be pinned is rounded to the fewest significant digits its error allows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import sympy as sp
from wtc.errors import SRError


@dataclass(frozen=True)
class Num:
    """A fixed constant: its float value, exact sympy form, text and description cost (digits).

    form: the sympy form, or a function of no arguments that builds it. Snapping weighs thousands
    of candidates per formula and writes a few; building each one's sympy object up front was a
    third of the snapping time (parity_last2's reading: 0.3 of 0.9 s), so `sym` builds it on first
    use. Nums compare by value, text, cost and exactness."""
    value: float
    form: object = field(compare=False)
    text: str
    cost: float
    exact: bool = True  # False: a rounded float that no simple number explained

    @property
    def sym(self) -> sp.Expr:
        if not isinstance(self.form, sp.Basic):
            object.__setattr__(self, "form", sp.sympify(self.form()))
        return self.form

    def __reduce__(self):        # pickled with its form built (a builder is a closure)
        return Num, (self.value, self.sym, self.text, self.cost, self.exact)

    def __repr__(self) -> str:
        return self.text


def _digits(n: int) -> int:
    return len(str(abs(int(n))))


def integer(n: int) -> Num:
    return Num(float(n), lambda: sp.Integer(n), str(n), _digits(n))


def from_fraction(f: Fraction) -> Num:
    if f.denominator == 1:
        return integer(f.numerator)
    return Num(f.numerator / f.denominator, lambda: sp.Rational(f.numerator, f.denominator),
               f"{f.numerator}/{f.denominator}", _digits(f.numerator) + _digits(f.denominator) + 0.5)


def decimal(m: int, e: int) -> Num:
    """m * 10**-e, written as a decimal; cost = significant digits (+ a little per leading zero)."""
    f = Fraction(m, 10**e)
    if f.denominator == 1:
        return integer(f.numerator)
    text = f"{m / 10**e:.{e}f}"
    sig = len(str(abs(m)).rstrip("0"))
    lead = max(0, e - len(str(abs(m))))  # zeros after the point before the first digit
    return Num(m / 10**e, lambda: sp.Rational(f.numerator, f.denominator), text, sig + 0.3 * lead)


# named constants a formula may carry: (text, sympy, value)
SPECIAL = (("pi", sp.pi, math.pi), ("E", sp.E, math.e), ("sqrt(2)", sp.sqrt(2), math.sqrt(2)),
           ("sqrt(3)", sp.sqrt(3), math.sqrt(3)), ("log(2)", sp.log(2), math.log(2)),
           ("log(10)", sp.log(10), math.log(10)))


def special_multiple(f: Fraction, special: tuple) -> Num:
    text, sym, value = special
    label = text if f == 1 else f"-{text}" if f == -1 else f"{f}*{text}"
    if abs(f) == 1:
        cost = 1.5
    elif f.denominator == 1:
        cost = 1.5 + _digits(f.numerator)
    else:
        cost = 2.0 + _digits(f.numerator) + _digits(f.denominator)
    return Num(float(f) * value, lambda: sym * sp.Rational(f.numerator, f.denominator), label, cost)


def pi_multiple(f: Fraction) -> Num:
    return special_multiple(f, SPECIAL[0])


def rounded(value: float, se: float) -> Num:
    """Fewest significant digits whose rounding error stays under a tenth of ``se``."""
    if not math.isfinite(value):
        raise SRError(f"cannot snap a non-finite constant ({value})")
    if value == 0:
        return integer(0)
    tol = max(abs(se) * 0.1, abs(value) * 1e-12)
    for sig in range(1, 17):
        r = float(f"{value:.{sig}g}")
        if abs(r - value) <= tol:
            break
    text = f"{r:.{sig}g}"
    f = Fraction(text) if "e" not in text else Fraction(r)
    return Num(r, (lambda: sp.Float(text, max(sig, 15))) if f.denominator != 1 else (lambda: sp.Integer(int(f))),
               text, sig + 2.0, exact=False)


def _ratio(x) -> tuple[int, int]:
    """x exactly as numerator, denominator (floats, numpy floats, ints, Fractions)."""
    ratio = getattr(x, "as_integer_ratio", None)
    return ratio() if ratio is not None else Fraction(x).as_integer_ratio()


def simplest_rational(lo: float, hi: float, max_den: int = 10_000) -> Fraction | None:
    """Stern-Brocot: the rational with the smallest denominator in [lo, hi].

    Walks the continued fractions of both ends (floats) until they part; the convergent built
    from the common prefix plus the smallest integer that separates them is the simplest."""
    if lo > hi:
        lo, hi = hi, lo
    if lo <= 0 <= hi:
        return Fraction(0)
    if hi < 0:
        r = simplest_rational(-hi, -lo, max_den)
        return -r if r is not None else None
    # convergents p/q built as h_n = a_n h_{n-1} + h_{n-2}. The ends are walked as exact rationals
    # (a float is one: an/ad, bn/bd from as_integer_ratio), in integers: float reciprocals lose an
    # end that is itself a simple fraction (lo = 49.75 gave 647/13 instead of 199/4, found by the
    # property test), and Fraction objects made this walk most of a formula's snapping time.
    p0, q0, p1, q1 = 0, 1, 1, 0
    an, ad = _ratio(lo)
    bn, bd = _ratio(hi)
    for _ in range(40):
        fa = an // ad
        if an % ad == 0 or (fa + 1) * bd <= bn:  # an integer lies in [a, b]: the smallest one ends the walk
            t = fa if an % ad == 0 else fa + 1
            p, q = t * p1 + p0, t * q1 + q0
            return Fraction(p, q) if q <= max_den else None
        p0, q0, p1, q1 = p1, q1, fa * p1 + p0, fa * q1 + q0
        if q1 > max_den:
            return None
        # a - fa and b - fa are positive here (a is not an integer, b >= a); reciprocals swap the ends
        an, ad, bn, bd = bd, bn - fa * bd, ad, an - fa * ad
    return None


def candidates_in(lo: float, hi: float, allow_pi: bool = True) -> list[Num]:
    """All simple-number candidates in [lo, hi], unordered."""
    out: list[Num] = []
    if lo <= 0 <= hi:
        return [integer(0)]
    # the decimal with the fewest places (e = 0: integers); among those, the one nearest the middle
    mid = (lo + hi) / 2
    for e in range(0, 7):
        s = 10**e
        m_lo, m_hi = math.ceil(lo * s - 1e-9), math.floor(hi * s + 1e-9)
        if m_lo <= m_hi:
            out.append(decimal(min(max(round(mid * s), m_lo), m_hi), e))
            break
    f = simplest_rational(lo, hi)
    if f is not None and f.denominator <= 1000:
        out.append(from_fraction(f))
    if allow_pi and (hi > 0.1 or lo < -0.1):
        for sc in SPECIAL:
            g = simplest_rational(lo / sc[2], hi / sc[2], max_den=12)
            if g is not None and g != 0 and abs(g.numerator) <= 12:
                out.append(special_multiple(g, sc))
    return out


def simplest_in(lo: float, hi: float, center: float | None = None, allow_pi: bool = True) -> Num | None:
    """Cheapest candidate in [lo, hi]; ties go to the one nearest ``center``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if lo > hi:
        lo, hi = hi, lo
    c = (lo + hi) / 2 if center is None else center
    cands = candidates_in(lo, hi, allow_pi)
    if not cands:
        return None
    return min(cands, key=lambda n: (n.cost, abs(n.value - c)))


def snap_options(value: float, se: float, z: float = 3.0) -> list[Num]:
    """Snapping choices from boldest to most cautious: simplest within z*se, then narrower
    intervals, finally the rounded float (always last, always valid)."""
    out: list[Num] = []
    for zz in (z, z / 3, z / 10):
        n = simplest_in(value - zz * se, value + zz * se, value)
        if n is not None and all(n.value != o.value for o in out):
            out.append(n)
    out.append(rounded(value, se))
    return out


def snap_choices(value: float, se: float, z: float = 3.0) -> list[Num]:
    """Every simple candidate (decimal, fraction, pi multiple) within z, z/3 and z/10 standard
    errors, cheapest first: for callers that judge the choices by the whole formula."""
    seen: dict[float, Num] = {}
    for zz in (z, z / 3, z / 10):
        if not (math.isfinite(value) and math.isfinite(se)):
            break
        for n in candidates_in(value - zz * se, value + zz * se):
            cur = seen.get(n.value)
            if cur is None or n.cost < cur.cost:
                seen[n.value] = n
    return sorted(seen.values(), key=lambda n: (n.cost, abs(n.value - value)))
