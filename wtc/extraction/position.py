"""An output that is a function of the position alone, read as its period.

Some outputs ignore the inputs (Parity_Bits_Mod2 is t mod 2 whatever the bits). A model computes
them from positional variables through sub-MLPs whose curves of t no regression reads as a period
(sin(t), t / cos(...), fitted on t = 0..9), so every replica learns the task and few read out. The
model's decisions say it directly: one decision per position, repeating with a period. Where the
period is at most half the length trained on (so it has been seen to repeat), the output is the
table indexed by t mod p — written `t % p` (times a scale, plus an offset) where the table is
that. Exact on the extraction data by construction; verification at 2T and 4T has the last word.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy as sp

from wtc.extraction.constants import number


@dataclass(frozen=True)
class PositionTable:
    """Decision `values[t % period]` at position t."""

    period: int
    values: tuple[float, ...]

    def expr(self, t: sp.Symbol) -> sp.Expr:
        phase = sp.Mod(t, self.period)
        k = np.arange(self.period)
        v = np.asarray(self.values)
        scale = (v[1] - v[0]) if self.period > 1 else 0.0
        if self.period > 1 and np.array_equal(v, v[0] + scale * k):      # linear in the phase: t % p
            return number(v[0]) + number(scale) * phase
        pieces = [(number(x), sp.Eq(phase, i)) for i, x in enumerate(self.values[:-1])]
        return sp.Piecewise(*pieces, (number(self.values[-1]), True))


def position_table(t: np.ndarray, decisions: np.ndarray) -> PositionTable | None:
    """The shortest period p (at most half the positions seen: it repeats in the data) with one
    decision per t mod p at every point; None when a position has two decisions (the output
    reads more than t) or no period repeats."""
    t = np.asarray(t).ravel().astype(np.int64)
    d = np.asarray(decisions, dtype=float).ravel()
    if t.shape != d.shape or not len(t) or not np.isfinite(d).all() or t.min() < 0:
        return None
    length = int(t.max()) + 1
    per_t = np.full(length, np.nan)
    per_t[t] = d
    if not np.array_equal(per_t[t], d) or np.isnan(per_t).any():
        return None
    for p in range(1, length // 2 + 1):
        if all(per_t[i] == per_t[i % p] for i in range(length)):
            return PositionTable(p, tuple(float(v) for v in per_t[:p]))
    return None

