"""Bottom-up enumeration of constant-free expressions by node count, with semantic dedup.

Every expression is evaluated on probe points: a subsample of the data (m points) followed by a few
off-distribution points (outside the data range and between integer values). Two expressions whose
rounded values agree on all probes are the same function for our purposes and only the first (the
smallest) is kept; the off-distribution probes keep apart forms that agree only on the data, such
as a*a and a on bits. New expressions of size s combine kept ones of smaller sizes, all pairs of
an operator at once (numpy broadcasting), so the Python work is per kept expression, not per try.
Within a size binary forms come first: of 1/x**2 and (1/x)**2 the first keeps the divisor visible
to the inner-constant pass (1/(x**2 + c)).
With four or more inputs the sum, maximum and minimum of all of them (chains of one operator, as
big as they are) join the library whatever its budget: a window's sum or maximum, a majority vote
(sum >= c) are one such term, far past the size the enumeration reaches with that many leaves.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wtc.sr.expr import OPS

_SENTINEL = np.float32(7.77e7)  # stands for nan/inf on off-distribution probes when hashing
_MAX_ABS = 1e12  # values beyond this on the data mean a near-singular form: dropped


@dataclass
class Library:
    """Kept expressions in order of size; ``vals`` (N, P) on the probes, data probes first."""
    trees: list = field(default_factory=list)
    sizes: list = field(default_factory=list)
    vals: np.ndarray | None = None  # (N, P)
    n_data: int = 0  # the first n_data probe columns are data points
    complete_size: int = 0  # every expression up to this size was enumerated
    chains: list = field(default_factory=list)  # indices of the all-input chains (sum, max, min)

    def __len__(self) -> int:
        return len(self.trees)


def off_distribution_points(X: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, k) points in twice the data box, at non-integer positions, some outside the range."""
    lo, hi = X.min(axis=0), X.max(axis=0)
    w = np.maximum(hi - lo, 1.0)
    pts = rng.uniform(lo - 0.5 * w, hi + 0.5 * w, size=(n, X.shape[1]))
    return pts + 0.0137 * w  # nudge off any integer / grid lattice


def enumerate_library(probes: np.ndarray, n_data: int, ops: tuple[str, ...], *, max_size: int,
                      max_terms: int, max_raw: float = 3e6, const_leaf: bool = True,
                      target: np.ndarray | None = None, int_consts: tuple = (),
                      rng: np.random.Generator | None = None) -> Library:
    """Enumerate expressions over the k probe columns of ``probes`` (P, k) using ``ops``.

    Sizes grow while the raw combination count stays under ``max_raw`` and the kept total under
    ``max_terms``. The last size may not fit the budget: then the forms kept from it are those most
    correlated with ``target`` (the data values of y, (n_data,)), else the first generated."""
    rng = np.random.default_rng(0) if rng is None else rng
    P, k = probes.shape
    proj = rng.standard_normal((P, 2))  # two random projections make a collision-free hash key
    unary = [OPS[o] for o in ops if OPS[o].arity == 1 and OPS[o].level < 99]
    binary = [OPS[o] for o in ops if OPS[o].arity == 2 and OPS[o].level < 99 and OPS[o].rhs != "const"]
    with_const = [OPS[o] for o in ops if OPS[o].arity == 2 and OPS[o].level < 99 and OPS[o].rhs != "any"]
    from wtc.sr import numbers as _nb
    consts = [("k", _nb.integer(int(c))) for c in int_consts] if with_const else []
    const_vals = np.array([np.full(P, float(c)) for c in int_consts]) if consts else np.empty((0, P))

    lib = Library(n_data=n_data)
    seen: set = set()
    by_size: dict[int, tuple[list, np.ndarray]] = {}

    def keep(cand_vals: np.ndarray, make_tree, s: int, allow_const: bool = False):
        """Filter a batch (B, P) to valid, new expressions; returns their (trees, vals)."""
        with np.errstate(all="ignore"):
            d = cand_vals[:, :n_data]
            ok = np.isfinite(d).all(axis=1) & (np.abs(d) < _MAX_ABS).all(axis=1)
            if not allow_const:  # constants come from the linear fit, not from the grammar
                ok &= np.ptp(d, axis=1) > 1e-12 * (1 + np.abs(d).max(axis=1))
            idx = np.flatnonzero(ok)
            if idx.size == 0:
                return [], np.empty((0, P))
            v32 = cand_vals[idx].astype(np.float32)
            v32[~np.isfinite(v32)] = _SENTINEL
            keys = v32.astype(np.float64) @ proj  # (B, 2)
        _, first = np.unique(keys, axis=0, return_index=True)
        first.sort()  # generation order: smaller / earlier forms win
        trees, rows = [], []
        for f in first:
            key = (keys[f, 0], keys[f, 1])
            if key in seen:
                continue
            seen.add(key)
            trees.append(make_tree(idx[f]))
            rows.append(idx[f])
        return trees, cand_vals[np.array(rows, dtype=int)] if rows else np.empty((0, P))

    # size 1: variables and the constant one
    leaves = [("x", i) for i in range(k)]
    leaf_vals = [probes[:, i] for i in range(k)]
    if const_leaf:
        leaves.append(("1",))
        leaf_vals.append(np.ones(P))
    t1, v1 = keep(np.array(leaf_vals), lambda i: leaves[i], 1, allow_const=True)
    by_size[1] = (t1, v1)
    total = len(t1)
    lib.complete_size = 1

    with np.errstate(all="ignore"):
        for s in range(2, max_size + 1):
            raw = sum(len(by_size[s - 1][0]) for _ in unary)
            if s >= 3:
                raw += len(with_const) * len(consts) * len(by_size[s - 2][0])
            for s1 in range(1, s - 1):
                n1, n2 = len(by_size[s1][0]), len(by_size[s - 1 - s1][0])
                raw += len(binary) * n1 * n2
            if raw > max_raw or total >= max_terms:
                break
            trees_s: list = []
            vals_s: list = []
            for op in binary:
                for s1 in range(1, s - 1):
                    s2 = s - 1 - s1
                    if op.commutative and s1 > s2:
                        continue
                    ta, va = by_size[s1]
                    tb, vb = by_size[s2]
                    if not ta or not tb:
                        continue
                    # chunk over the left operand to bound memory (rows x nb x P)
                    step = max(1, int(2e6 // max(1, len(tb) * P)))
                    for a0 in range(0, len(ta), step):
                        a1 = min(len(ta), a0 + step)
                        block = op.fn(va[a0:a1, None, :], vb[None, :, :])  # (na, nb, P)
                        na, nb = a1 - a0, len(tb)
                        if op.commutative and s1 == s2:  # each unordered pair once
                            ii, jj = np.nonzero(np.arange(a0, a1)[:, None] <= np.arange(nb)[None, :])
                        else:
                            ii, jj = np.divmod(np.arange(na * nb), nb)
                        flat = block[ii, jj]
                        t, v = keep(flat, lambda r, ii=ii, jj=jj, a0=a0, op=op, ta=ta, tb=tb:
                                    (op.name, ta[a0 + ii[r]], tb[jj[r]]), s)
                        trees_s += t
                        vals_s.append(v)
            for op in with_const:  # s = size(a) + the operator + the constant
                tp, vp = by_size[s - 2] if s >= 3 else ([], None)
                if not tp or not consts:
                    continue
                block = op.fn(vp[:, None, :], const_vals[None, :, :])  # (na, nc, P)
                nc = len(consts)
                ii, jj = np.divmod(np.arange(len(tp) * nc), nc)
                t, v = keep(block.reshape(-1, P), lambda r, ii=ii, jj=jj, op=op, tp=tp:
                            (op.name, tp[ii[r]], consts[jj[r]]), s)
                trees_s += t
                vals_s.append(v)
            for op in unary:
                tp, vp = by_size[s - 1]
                if not tp:
                    continue
                t, v = keep(op.fn(vp), lambda i, tp=tp, op=op: (op.name, tp[i]), s)
                trees_s += t
                vals_s.append(v)
            vals_cat = np.concatenate(vals_s) if vals_s else np.empty((0, P))
            room = max_terms - total
            if len(trees_s) > room:  # budget reached inside this size: keep the most promising
                order = _rank(vals_cat[:, :n_data], target)[:room]
                order.sort()
                trees_s = [trees_s[i] for i in order]
                vals_cat = vals_cat[order]
            else:
                lib.complete_size = s
            by_size[s] = (trees_s, vals_cat)
            total += len(trees_s)

    chains = _chains(ops, k, probes, keep) if k >= CHAIN_INPUTS else {}
    for s, (t, v) in chains.items():
        if s in by_size:
            by_size[s] = (t + by_size[s][0], np.concatenate([v, by_size[s][1]]))
        else:
            by_size[s] = (t, v)
    for s in sorted(by_size):
        t, v = by_size[s]
        if s in chains:
            lib.chains += range(len(lib.trees), len(lib.trees) + len(chains[s][0]))
        lib.trees += t
        lib.sizes += [s] * len(t)
    lib.vals = np.concatenate([by_size[s][1] for s in sorted(by_size)])
    lib.sizes = list(lib.sizes)
    return lib


CHAIN_INPUTS = 4  # fewer inputs: the enumeration reaches the chains by itself


def _chains(ops, k: int, probes: np.ndarray, keep) -> dict:
    """{size: (trees, vals)}: op(x0, op(x1, ...)) over all k inputs for add, max and min in ops, each
    kept only if no smaller form equals it (keep's semantic dedup)."""
    out: dict = {}
    size = 2 * k - 1
    for name in ("add", "max", "min"):
        if name not in ops:
            continue
        op = OPS[name]
        tree, vals = ("x", k - 1), probes[:, k - 1]
        for i in range(k - 2, -1, -1):
            tree, vals = (name, ("x", i), tree), op.fn(probes[:, i], vals)
        t, v = keep(vals[None, :], lambda _, tree=tree: tree, size)
        if t:
            prev = out.get(size, ([], np.empty((0, len(vals)))))
            out[size] = (prev[0] + t, np.concatenate([prev[1], v]))
    return out


def _rank(d: np.ndarray, target: np.ndarray | None) -> np.ndarray:
    """Indices of rows of d (B, m) by decreasing |correlation| with target (generation order if None)."""
    if target is None:
        return np.arange(len(d))
    dc = d - d.mean(axis=1, keepdims=True)
    tc = target - target.mean()
    with np.errstate(all="ignore"):
        r = np.abs(dc @ tc) / (np.linalg.norm(dc, axis=1) * (np.linalg.norm(tc) + 1e-300) + 1e-300)
    return np.argsort(-np.nan_to_num(r), kind="stable")
