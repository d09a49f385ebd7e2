"""A two-valued output of two-valued variables read as the shortest rule: a conjunction (or its
negation) of literals (`x == 1`) and pair relations (`x != prev1_x`).

A regression over bits finds a polynomial whose rounding is the decision: Alternating_Last4's
output was read as -p1*p2/2 + p1*p3/2 + p2*x/2 - p3*x/2 + 0.07, right on every bit sequence to
length 13 but a weighted sum that merely rounds like the rule, far from the model's raw output, so
not a reading of it. On two-valued inputs the decisions are a truth table; the shortest conjunction
that equals the model's decisions at every extraction point (`x != prev1_x and prev1_x != prev2_x
and prev2_x != prev3_x`) says the same thing the way a person would. Exact on the data by
construction; verification (fresh draws, exhaustive where small, 2T) has the last word.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import sympy as sp

from wtc.extraction.constants import number

MAX_VARIABLES = 6          # two-valued variables a rule may be searched over
MAX_TERMS = 4              # atoms in the conjunction at most


@dataclass(frozen=True)
class Atom:
    """`a == b`, `a != b` (two variables with the same two values) or `a == value`."""

    a: str
    op: str                  # "==" | "!="
    b: str | None = None
    value: float | None = None

    def expr(self) -> sp.Expr:
        rhs = sp.Symbol(self.b) if self.b is not None else number(self.value)
        return sp.Eq(sp.Symbol(self.a), rhs) if self.op == "==" else sp.Ne(sp.Symbol(self.a), rhs)


@dataclass(frozen=True)
class Rule:
    """`when` where all atoms hold, else `otherwise`."""

    atoms: tuple[Atom, ...]
    when: float
    otherwise: float

    def expr(self) -> sp.Expr:
        condition = sp.And(*[a.expr() for a in self.atoms], evaluate=False) if len(self.atoms) > 1 \
            else self.atoms[0].expr()
        return sp.Piecewise((number(self.when), condition), (number(self.otherwise), True))


def shortest_rule(columns: dict[str, np.ndarray], decisions: np.ndarray) -> Rule | None:
    """The conjunction of the fewest atoms over `columns` (name -> values at each point, each
    two-valued, in the order the program reads them) that gives `decisions` (two values) at every
    point, relating neighbours in that order where several do; None when a column has more
    than two values, the decisions are not a function of the columns, or no rule of MAX_TERMS
    atoms does."""
    names = list(columns)
    d = np.asarray(decisions, dtype=float).ravel()
    if not names or len(names) > MAX_VARIABLES or len(np.unique(d)) != 2:
        return None
    cols = np.stack([np.asarray(columns[n], dtype=float).ravel() for n in names], axis=1)
    if cols.shape[0] != d.shape[0] or not np.isfinite(cols).all():
        return None
    levels = [tuple(np.unique(cols[:, i])) for i in range(len(names))]
    if any(len(lv) > 2 for lv in levels):
        return None
    rows, inverse = np.unique(cols, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    truth = np.full(len(rows), np.nan)
    truth[inverse] = d
    if not np.array_equal(truth[inverse], d):          # two decisions for one combination
        return None
    atoms = _atoms(names, levels)
    masks = [_mask(a, names, rows) for a in atoms]
    lo, hi = np.unique(d)
    wants = [(float(hi), float(lo), _bits(truth == hi)), (float(lo), float(hi), _bits(truth == lo))]
    for k in range(1, MAX_TERMS + 1):
        found = []
        for pick in itertools.combinations(range(len(atoms)), k):
            m = masks[pick[0]]
            for i in pick[1:]:
                m &= masks[i]
            found += [(when, otherwise, pick) for when, otherwise, want in wants if m == want]
        if found:         # of the shortest, the one relating variables nearest in the order read
            when, otherwise, pick = min(found, key=lambda f: sum(_span(atoms[i], names) for i in f[2]))
            return Rule(tuple(atoms[i] for i in pick), when, otherwise)
    return None


def _span(atom: Atom, names: list[str]) -> int:
    return 0 if atom.b is None else abs(names.index(atom.a) - names.index(atom.b))


def _atoms(names, levels) -> list[Atom]:
    out = []
    for i, j in itertools.combinations(range(len(names)), 2):     # relations first: the rule's shape
        if levels[i] == levels[j] and len(levels[i]) == 2:
            out += [Atom(names[i], "!=", names[j]), Atom(names[i], "==", names[j])]
    for n, lv in zip(names, levels):
        out += [Atom(n, "==", value=float(v)) for v in lv]
    return out


def _mask(atom: Atom, names: list[str], rows: np.ndarray) -> int:
    a = rows[:, names.index(atom.a)]
    b = rows[:, names.index(atom.b)] if atom.b is not None else atom.value
    return _bits(a == b if atom.op == "==" else a != b)


def _bits(flags: np.ndarray) -> int:
    return int(sum(1 << i for i, f in enumerate(flags.tolist()) if f))

