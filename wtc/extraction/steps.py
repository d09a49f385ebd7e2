"""A two-valued output read as one cut of one variable, at the simplest number in the gap.

A decision read through a learned curve keeps the curve's crossing: Majority_0_1's output was
`sign(m1)` with m1 a smooth function of the prefix mean that crosses zero at 0.52, right on every
sequence of the lengths it was trained on (no prefix mean there falls in (1/2, 10/19)) and wrong at
4T, where 20/39 does. The model's decisions say only that the cut lies in the gap between the
largest value decided one way and the smallest decided the other; the simplest number in that gap
(smallest denominator) is the reading that does not invent a constant (here `mean_x > 1/2`).

Only for a variable whose values mean something by themselves (an input, a route, a prefix mean,
sum or weighted sum), never for a sub-MLP's curve, and only where the decisions are a function of
that variable alone with one change along it: then the step agrees with the model on every
extraction sequence by construction, and verification (fresh draws, exhaustive where small, 2T)
still has the last word.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import sympy as sp

from wtc.extraction.constants import number

MAX_DENOMINATOR = 1000        # a cut needing a larger denominator is written as the gap's low end


@dataclass(frozen=True)
class Step:
    """Decisions `below` up to the cut, `above` past it; `strict`: v > cut (else v >= cut)."""

    cut: Fraction
    strict: bool
    below: float
    above: float

    def expr(self, v: sp.Symbol) -> sp.Expr:
        cut = sp.Rational(self.cut.numerator, self.cut.denominator)
        past = sp.StrictGreaterThan(v, cut) if self.strict else sp.GreaterThan(v, cut)
        return sp.Piecewise((number(self.above), past), (number(self.below), True))

    def describe(self, name: str) -> str:
        return f"{number(self.above)} where {name} {'>' if self.strict else '>='} {self.cut}, else {number(self.below)}"


def one_step(v: np.ndarray, decisions: np.ndarray) -> Step | None:
    """The step of v that gives `decisions` (two values) at every point, cut at the simplest number
    in the gap between the two sides; None when the decisions are not a function of v, take other
    than two values, or change more than once along v."""
    v = np.asarray(v, dtype=float).ravel()
    d = np.asarray(decisions, dtype=float).ravel()
    if v.shape != d.shape or not len(v) or not (np.isfinite(v).all() and np.isfinite(d).all()):
        return None
    if len(np.unique(d)) != 2:
        return None
    values, inverse = np.unique(v, return_inverse=True)
    first = np.full(len(values), np.nan)
    first[inverse[::-1]] = d[::-1]                      # a decision per distinct value ...
    if not np.array_equal(first[inverse], d):           # ... that every point with it shares
        return None
    changes = np.flatnonzero(first[1:] != first[:-1])
    if len(changes) != 1:
        return None
    k = int(changes[0])
    low, high = float(values[k]), float(values[k + 1])
    strict = simplest_between(low, high, low_closed=True, high_closed=False)        # v > c, c in [low, high)
    loose = simplest_between(low, high, low_closed=False, high_closed=True)         # v >= c, c in (low, high]
    cut, is_strict = min((strict, True), (loose, False), key=lambda c: (c[0].denominator, abs(c[0].numerator)))
    return Step(cut, is_strict, float(first[k]), float(first[k + 1]))


def simplest_between(low: float, high: float, *, low_closed: bool, high_closed: bool) -> Fraction:
    """The fraction of smallest denominator (then smallest size) in the interval, compared as the
    program compares it (p / q as a float); the closed end itself when none up to MAX_DENOMINATOR is."""
    for q in range(1, MAX_DENOMINATOR + 1):
        p = math.floor(low * q) - 1
        while not _above(p / q, low, low_closed):
            p += 1
        if _below(p / q, high, high_closed):
            candidates = [p]
            if p < 0:                                   # several fit: the one nearest zero
                while _below((candidates[-1] + 1) / q, high, high_closed) and candidates[-1] < 0:
                    candidates.append(candidates[-1] + 1)
            return Fraction(min(candidates, key=abs), q)
    return Fraction(low) if low_closed else Fraction(high)


def _above(c: float, low: float, closed: bool) -> bool:
    return c >= low if closed else c > low


def _below(c: float, high: float, closed: bool) -> bool:
    return c <= high if closed else c < high

