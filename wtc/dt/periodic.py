"""Periodic aggregate heads (DTConfig.agg_ops "per2" .. "per8"; beyond the paper): a prefix sum
weighted by a learned periodic function of the distance,

    out_t = sum_{j <= t} c[(t - j) mod p] * v_j          (written to the stream divided by T)

A number read digit by digit in base g, modulo d, is such a sum: N_t = sum_j b_j g^(t - j), and
g^k mod d has a period p (d = 3, g = 2: c = (1, 2) = (1, -1) mod 3, an alternating sum; d = 5:
c = (1, 2, 4, 3); d = 7: c = (1, 2, 4)); so are the impulse responses of an oscillation whose
period is a whole number of steps (a spring: sin((k + 1) theta) / sin(theta)). A sub-MLP's periodic
units (DTConfig.mlp_periods) then read the residue exactly when c is integral.

Computed in O(p T): one masked cumulative sum per phase s = j mod p, S_s[t] = sum_{j <= t, j = s
mod p} v_j, then out_t = sum_s c[(t - s) mod p] S_s[t] (no T x T matrix). Written divided by T, as a
"sum" head (wtc.dt.attention): the raw sum grows with T and would dominate the early selections.

Initialisation: integer patterns, a different one per replica and head (a population searches the
patterns; gradients adjust within one), simplest first: the powers of g modulo d of period p
(centred residues), the oscillations of period p, then small integer patterns. Near-integral
coefficients are set to the integers after training when the replica's loss does not rise
(wtc.dt.periodic_snap), so the program's line is exact.
"""
from __future__ import annotations

import itertools
import math
import re

import torch
from torch import nn

PERIODS = range(2, 9)                  # the periods an op name may give ("per2" .. "per8")
COEF_STEP = 2.0 ** -5                  # a coefficient moves this times as fast as other parameters


def period_of(op: str) -> int | None:
    """The period of a periodic aggregate op ("per3" -> 3), None for any other op."""
    m = re.fullmatch(r"per(\d+)", op)
    return int(m.group(1)) if m and int(m.group(1)) in PERIODS else None


def periodic_sum(val: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """val (..., T), coef (..., p) with the same leading dims -> (..., T):
    out_t = sum_{j <= t} coef[(t - j) mod p] val_j, in O(p T)."""
    p, T = coef.shape[-1], val.shape[-1]
    t = torch.arange(T, device=val.device)
    s = torch.arange(p, device=val.device)
    phase = (t[None, :] % p == s[:, None]).to(val.dtype)                  # (p, T): j mod p == s
    sums = (val.unsqueeze(-2) * phase).cumsum(-1)                         # (..., p, T)
    weights = coef[..., (t[None, :] - s[:, None]) % p]                    # (..., p, T): c[(t - s) mod p]
    return (weights * sums).sum(-2)


def _centred(v: int, d: int) -> int:
    v %= d
    return v - d if v > d / 2 else v


def _canonical(c: tuple[int, ...]) -> tuple[int, ...] | None:
    """Primitive, first nonzero entry positive, not constant (a constant pattern is a "sum" head)."""
    if len(set(c)) == 1:
        return None
    g = math.gcd(*c)
    c = tuple(v // g for v in c)
    first = next(v for v in c if v)
    return tuple(-v for v in c) if first < 0 else c


def _powers(p: int) -> list[tuple[int, int]]:
    """(d, g) with 3 <= d <= 2 p + 3 and g of multiplicative order p modulo d: the powers of g
    modulo d have period p."""
    return [(d, g) for d in range(3, 2 * p + 4) for g in range(2, d)
            if math.gcd(g, d) == 1 and min(k for k in range(1, d) if pow(g, k, d) == 1) == p]


def moduli(p: int) -> tuple[int, ...]:
    """The moduli d of the initial patterns of period p (the residues a sub-MLP then reads from
    such a sum: its periodic units need these periods)."""
    return tuple(sorted({d for d, _ in _powers(p)}))


def initial_patterns(p: int, limit: int = 64) -> list[tuple[int, ...]]:
    """Integer patterns of period p, simplest first: powers of g modulo d (order p, centred
    residues, d ascending), oscillations of period p with integer responses, then small patterns by
    largest magnitude and total size."""
    out: list[tuple[int, ...]] = []

    def add(c):
        c = _canonical(tuple(int(v) for v in c))
        if c is not None and c not in out:
            out.append(c)

    for d, g in _powers(p):
        add([_centred(pow(g, k, d), d) for k in range(p)])
    for m in range(1, p // 2 + 1):            # sin((k + 1) theta) / sin(theta), theta = 2 pi m / p
        theta = 2 * math.pi * m / p
        if abs(math.sin(theta)) > 1e-9:
            c = [math.sin((k + 1) * theta) / math.sin(theta) for k in range(p)]
            if all(abs(v - round(v)) < 1e-9 for v in c):
                add([round(v) for v in c])
    small = sorted(itertools.product(range(-2, 3), repeat=p), key=lambda c: (max(map(abs, c)), sum(map(abs, c))))
    for c in small:
        if len(out) >= limit:
            break
        if any(c):
            add(c)
    return out[:limit]


class PeriodicAggregates(nn.Module):
    """The periodic heads of one layer's aggregates: coefficients (R, n, p_max), entries past a
    head's own period unused (zero gradient). Stored in units of COEF_STEP (the parameter theta =
    c / COEF_STEP): Adam moves a parameter by about lr per step whatever its gradient's scale, and
    at the DT's lr coefficients left free drifted from their integer patterns by 0.2-0.6 before the
    sub-MLPs read the sums (Div_3, two per2 heads: 7 of 8 replicas off the integers, none solved),
    and at 1/8 of it still by 0.5 (discover's Div_3: its one replica solved at (1.51, -1.70), a
    reading that fails at twice the length). A power of two keeps integers exact."""

    def __init__(self, replicas: int, agg_ops: list[str]):
        super().__init__()
        self.heads = [a for a, op in enumerate(agg_ops) if period_of(op)]
        self.periods = [period_of(agg_ops[a]) for a in self.heads]
        width = max(self.periods)
        coef = torch.zeros(replicas, len(self.heads), width)
        for i, p in enumerate(self.periods):
            patterns = initial_patterns(p)
            for r in range(replicas):      # head i of replica r: a different pattern per (replica, head)
                coef[r, i, :p] = torch.tensor(patterns[(r * len(self.heads) + i) % len(patterns)], dtype=torch.float32)
        self.theta = nn.Parameter(coef / COEF_STEP)

    @property
    def coef(self) -> torch.Tensor:
        """(R, n, p_max) the coefficients c (differentiable)."""
        return self.theta * COEF_STEP

    @torch.no_grad()
    def set_coef(self, values: torch.Tensor) -> None:
        """Set the coefficients c (R, n, p_max)."""
        self.theta.copy_(values / COEF_STEP)

    def forward(self, val: torch.Tensor, out: torch.Tensor, seq_len: int) -> torch.Tensor:
        """val (R, B, A, T) the aggregates' values, out (R, B, A, T) what the uniform ops wrote ->
        out with the periodic heads' weighted prefix sums / seq_len in their places."""
        cols = list(out.unbind(2))
        for i, (a, p) in enumerate(zip(self.heads, self.periods)):
            cols[a] = periodic_sum(val[:, :, a], self.coef[:, None, i, :p]) / seq_len
        return torch.stack(cols, 2)

    def coefficients(self, replica: int, head: int) -> list[float]:
        """Aggregate head `head`'s coefficients c[0 .. p-1] in replica `replica`."""
        i = self.heads.index(head)
        return [float(v) for v in self.coef.detach()[replica, i, :self.periods[i]]]


def periodic_sizing(config, dep, left: set[str], changes: dict, base_periods: tuple[int, ...]) -> str:
    """discover's sizing (wtc.discovery.sized_for) where the probe found a prefix read through
    sums weighted with period p (Dependence.periods): periodic aggregate heads of those periods
    only (a mean head beside them was live in the output and its third leaf kept the regression
    from ((A mod 3) + x) mod 2 on Div_3; every head is a pattern tried), and sub-MLP periodic units for the moduli of their initial patterns
    (besides base_periods, those discover gives for oscillation). Fields the user set (not in
    `left`) stay. Updates `changes`; returns what it did, or ""."""

    found = sorted({p for p in getattr(dep, "periods", []) if p})
    if "agg_ops" not in left or not found:
        return ""
    ops = tuple(f"per{p}" for p in found)
    changes["agg_ops"] = ops
    if "n_agg_heads" in left:
        changes["n_agg_heads"] = max(len(ops), max(config.n_agg_heads), changes.get("n_agg_heads", 0))
    said = f"periodic aggregate heads ({', '.join(ops)})"
    # a residue of the sum needs the moduli's periodic units; a linear response (found as an exact
    # affine function of the phase sums, wtc.tasks.probe) is read by the head alone
    residues = sorted({p for p, a in zip(dep.periods, getattr(dep, "affine", []) or [False] * len(dep.periods))
                       if p and not a})
    if "mlp_periods" in left and not config.mlp_periods and residues:
        periods = tuple(sorted(set(changes.get("mlp_periods", base_periods)).union(*(moduli(p) for p in residues))))
        changes["mlp_periods"] = periods
        said += f" and periodic sub-MLP units (periods {', '.join(map(str, periods))})"
    return said
