"""An integer output read as the argmax of whole-number linear scores of prefix counts.

A model whose output reads only prefix means and sums of functions of one discrete input (and the
position) computes a function of that input's prefix counts, how often each value has been seen:
the mean of g(x_j) over j <= t is sum_v g(v) * count_v / (t + 1), and t + 1 is the sum of the
counts. A majority vote learned that way (Majority_0_2: mean_x and the mean of a sub-MLP of x,
then a sub-MLP deciding between the three values) is piecewise constant over its inputs with
linear boundaries, which no formula reader expresses; over the counts it is

    out = classes[first i with s_i = max(s)],    s_i = W[i] . counts (+ b[i])

read here with W and b the smallest whole numbers (L1) that reproduce the decisions, found by a
linear program. Whole-number scores of whole-number counts tie exactly, so the margins are whole
numbers too: a class must beat by at least 1 every class that a tie would give the win, and by 0
the others. Ties go to the first class in the order found (ascending or descending: both are
tried). Misfit decisions (a network wrong near a tie) get slack; the reading says how many of the
model's decisions it keeps, and verification on fresh data has the last word.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import sympy as sp

from wtc.extraction.constants import number

MAX_CLASSES = 8            # an argmax over more decisions than this is not a vote read here
MAX_DENOMINATOR = 64       # an LP solution's entries as fractions before scaling to whole numbers
MAX_WEIGHT = 1000          # ... and no whole-number weight larger than this (else no reading)
SLACK_COSTS = (1.0, 10.0, 100.0)   # a missed margin (per position) against a unit of weight, cheapest first
SCREEN_ROWS = 300          # the screen reads this many distinct rows (a fixed sample) ...
SCREEN_AGREEMENT = 0.95    # ... and the fits, on up to MAX_ROWS, run only where it kept this share
MAX_ROWS = 3000
LP_TIME_LIMIT = 10.0       # seconds per linear program; one that runs out gives no reading


@dataclass(frozen=True)
class ArgmaxReading:
    """Decisions as the argmax of whole-number scores: class order (ties to the first), weights
    (classes x features), the feature names, an optional bias per class, and the share of the
    decisions it reproduces."""

    classes: tuple[float, ...]
    weights: tuple[tuple[int, ...], ...]
    features: tuple[str, ...]
    bias: tuple[int, ...] | None
    agreement: float

    @property
    def ties(self) -> str:
        """Which class a tie goes to: "smaller", "larger" or the first in the class order."""
        if list(self.classes) == sorted(self.classes):
            return "smaller"
        if list(self.classes) == sorted(self.classes, reverse=True):
            return "larger"
        return "the first of " + ", ".join(str(number(c)) for c in self.classes)

    def scores(self) -> list[sp.Expr]:
        symbols = [sp.Symbol(f) for f in self.features]
        b = self.bias or (0,) * len(self.classes)
        return [sum((int(w) * s for w, s in zip(row, symbols)), sp.Integer(int(bi))) for row, bi in zip(self.weights, b)]

    def expr(self) -> sp.Expr:
        """The first class whose score is the largest: branch i is taken when s_i >= every later
        score (every earlier branch failed, so some later score beat each earlier one)."""
        s = self.scores()
        branches = [(number(c), sp.And(*[sp.GreaterThan(s[i], s[j]) for j in range(i + 1, len(s))]))
                    for i, c in enumerate(self.classes[:-1])]
        return sp.Piecewise(*branches, (number(self.classes[-1]), True))

    def describe(self) -> str:
        terms = ", ".join(f"{number(c)}: {s}" for c, s in zip(self.classes, self.scores()))
        ties = self.ties
        return f"the class of the largest score ({terms}; ties to {'the ' * (ties in ('smaller', 'larger'))}{ties})"


def read_argmax(features: np.ndarray, decisions: np.ndarray, names: tuple[str, ...], *,
                min_agreement: float = 1.0) -> ArgmaxReading | None:
    """features (n, m) whole numbers, decisions (n,): the smallest whole-number argmax reading that
    reproduces at least min_agreement of the decisions, or None (too many classes, non-whole
    features, no such scores). Scores without a bias are tried first, then with one."""
    F = np.asarray(features, dtype=float)
    d = np.asarray(decisions, dtype=float).ravel()
    if F.ndim != 2 or F.shape[0] != d.shape[0] or F.shape[1] != len(names) or not len(d):
        raise ValueError(f"features must be (n, {len(names)}) with one decision per row, got {F.shape} and {d.shape}")
    if not (np.isfinite(F).all() and np.isfinite(d).all()) or not np.array_equal(F, np.round(F)):
        return None
    classes = np.unique(d)
    if not 2 <= len(classes) <= MAX_CLASSES:
        return None
    rows, counts = np.unique(np.column_stack([F, d]), axis=0, return_counts=True)
    pick = np.random.default_rng(0).permutation(len(rows))
    best = None
    for with_bias in (False, True):
        for order in (classes, classes[::-1]):
            # a screen on a few distinct rows, misfits dear: a function of the counts that is no vote (a
            # residue) is refused before a large program runs
            screen = _reading(rows, counts, pick[:SCREEN_ROWS], order, with_bias, names, F, d, SLACK_COSTS[-1])
            if screen is None or screen[0].agreement < min(min_agreement, SCREEN_AGREEMENT):
                continue
            # misfits cheap first: the simplest scores that keep min_agreement, not scores bent to the
            # network's own few wrong decisions near ties (19 n0 + 2 n1 against 21 n1 - 2 n3 ...)
            for slack in SLACK_COSTS:
                found = _reading(rows, counts, pick[:MAX_ROWS], order, with_bias, names, F, d, slack)
                if found is not None and found[0].agreement >= min_agreement:
                    if best is None or (found[1], -found[0].agreement) < (best[1], -best[0].agreement):
                        best = found
                    break
        if best is not None:
            return best[0]
    return None


def _reading(rows, counts, pick, order, with_bias: bool, names, F, d, slack: float) -> tuple[ArgmaxReading, float] | None:
    """The LP on the distinct rows picked -> (its reading with its agreement on every decision, L1 size)."""
    X = rows[pick, :-1]
    X = np.column_stack([X, np.ones(len(X))]) if with_bias else X
    found = _fit(X, rows[pick, -1], counts[pick], order, slack)
    if found is None:
        return None
    W, cost = found
    m = len(names)
    reading = ArgmaxReading(tuple(float(c) for c in order), tuple(tuple(int(w) for w in r[:m]) for r in W),
                            tuple(names), tuple(int(r[-1]) for r in W) if with_bias else None, 0.0)
    return dataclasses.replace(reading, agreement=float(np.mean(predict(reading, F) == d))), cost


def predict(reading: ArgmaxReading, features: np.ndarray) -> np.ndarray:
    """The reading's decisions on features (n, m): the first class of the largest score."""
    F = np.asarray(features, dtype=np.int64)
    scores = F @ np.asarray(reading.weights, dtype=np.int64).T
    if reading.bias is not None:
        scores = scores + np.asarray(reading.bias, dtype=np.int64)
    return np.asarray(reading.classes)[np.argmax(scores, axis=1)]


def _fit(X: np.ndarray, y: np.ndarray, weight: np.ndarray, order: np.ndarray,
         slack_cost: float) -> tuple[np.ndarray, float] | None:
    """The LP: minimize sum |W| + slack_cost * sum(weight * slack) subject to, for every row r and
    class c other than its own y, (W_y - W_c) . X_r + slack_r >= 1 if c comes before y in order
    (it would win a tie), else >= 0. Returns (whole-number W, its L1 size) or None."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    K, (n, m) = len(order), X.shape
    index = {float(c): i for i, c in enumerate(order)}
    own = np.array([index[float(v)] for v in y])
    r_idx, c_idx = np.nonzero(np.arange(K)[None, :] != own[:, None])     # one constraint per (row, other class)
    nc = len(r_idx)
    margin = (c_idx < own[r_idx]).astype(float)
    # variables: W+ (K*m), W- (K*m), slack (nc); constraint: -(W_y - W_c) . X_r - slack <= -margin
    rows_, cols_, vals_ = [], [], []
    k = np.arange(nc)
    for sign, part in ((1.0, 0), (-1.0, K * m)):                          # W = W+ - W-
        for j in range(m):
            v = X[r_idx, j]
            rows_ += [k, k]
            cols_ += [part + own[r_idx] * m + j, part + c_idx * m + j]
            vals_ += [-sign * v, sign * v]
    rows_.append(k)
    cols_.append(2 * K * m + k)
    vals_.append(-np.ones(nc))
    A = coo_matrix((np.concatenate(vals_), (np.concatenate(rows_), np.concatenate(cols_))), shape=(nc, 2 * K * m + nc))
    cost = np.concatenate([np.ones(2 * K * m), slack_cost * weight[r_idx].astype(float)])
    res = linprog(cost, A_ub=A.tocsr(), b_ub=-margin, bounds=(0, None), method="highs",
                  options={"time_limit": LP_TIME_LIMIT})
    if res.status != 0:
        return None
    W = res.x[:K * m] - res.x[K * m:2 * K * m]
    whole = _whole(W)
    if whole is None:
        return None
    return whole.reshape(K, m), float(np.abs(whole).sum())


def _whole(w: np.ndarray) -> np.ndarray | None:
    """w scaled to the smallest whole numbers with the same ratios (entries as fractions of
    denominator at most MAX_DENOMINATOR); None if one would exceed MAX_WEIGHT or all are 0."""
    fractions = [Fraction(float(v)).limit_denominator(MAX_DENOMINATOR) for v in w]
    scale = math.lcm(*(f.denominator for f in fractions))
    whole = [int(f * scale) for f in fractions]          # Python ints: many denominators multiply past int64
    g = math.gcd(*whole)
    if g == 0:
        return None
    whole = [v // g for v in whole]
    return None if max(abs(v) for v in whole) > MAX_WEIGHT else np.array(whole, dtype=np.int64)

