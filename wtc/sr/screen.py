"""Fast linear screen: every y ~ theta0 + sum_j theta_j g_j with 1, 2 or 3 library terms g_j.

On the screening points (~128, weighted) terms are centred (absorbs theta0) and normalised, so one
Gram matrix G = U U' and b = U y give the residual sum of squares of any subset in closed form:
  1 term   sse = yy - b_i^2
  2 terms  sse = yy - (b_i^2 + b_j^2 - 2 b_i b_j G_ij) / (1 - G_ij^2)
  3 terms  yy - b' A^-1 b with the 3x3 block A of G (adjugate formula).
Pairs are screened exhaustively, triples among the smallest terms plus every third term on the best
pairs (wtc._C.screen, or the numba kernels of wtc.sr.numba_eval: op sr.screen of wtc.backend). The screen returns (a) subsets whose estimated rmse passes
a loose threshold, without those that contain a smaller passing subset, and (b) the best few
subsets per lower bound of complexity, for the Pareto table and as seeds of the inner pass.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCREEN_MARGIN = 1.5  # the screen lets through rmse <= SCREEN_MARGIN * tolerance (it sees a sample)


@dataclass
class Combo:
    terms: tuple  # library indices
    sse: float  # on the screening points
    lb: int  # lower bound of the complexity of theta0 + sum theta_j g_j


@dataclass
class ScreenResult:
    passing: list  # Combo, sorted by (lb, sse)
    best: list  # Combo: the best few per lb
    sse_min: float


def prepare_columns(vals: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Weighted-centred, unit-norm columns (N, m) and centred y; drops constant and
    linearly duplicate terms (same direction; keeping the first = smallest). Returns (U, yc, kept indices)."""
    sw = np.sqrt(w)
    W = w.sum()
    with np.errstate(all="ignore"):
        C = (vals - (vals @ w)[:, None] / W) * sw  # (N, m)
        norms = np.linalg.norm(C, axis=1)
        scale = np.abs(vals).max(axis=1) * np.sqrt(W) + 1e-300
        ok = np.isfinite(norms) & (norms > 1e-9 * scale)
        idx = np.flatnonzero(ok)
        U = C[idx] / norms[idx, None]
    # linear duplicates: the same unit vector (e.g. a+1 vs a, 2*a vs a). Opposite ones are kept
    # apart: of t and 1 - t the smaller term can make the longer formula ((x % 3 == 0) is 5 nodes,
    # 1 - x**2 % 3 is 7), and which one the target needs shows only in the refit
    key = np.round(U, 7) @ np.random.default_rng(1).standard_normal(U.shape[1])
    _, keep = np.unique(key, return_index=True)
    keep.sort()
    yc = (y - np.dot(w, y) / W) * sw
    return U[keep], yc, idx[keep]


def kernels():
    """The screen's loops: wtc._C.screen where wtc.backend chooses native for sr.screen, else the numba
    reference (imported, and compiled or loaded from its cache, on first use). Same signatures."""
    from wtc import backend

    if backend.choose("sr.screen", "cpu") == "native":
        return backend.require_native("sr.screen").screen
    from wtc.sr import numba_eval
    return numba_eval


def screen(U: np.ndarray, yc: np.ndarray, sizes: np.ndarray, sse_pass: float, *, max_lb: int,
           n_best: int = 3, n_triple_set: int = 240, n_extend: int = 40,
           max_pass: int = 3000) -> ScreenResult:
    """Screen all 1- and 2-term subsets of the columns U (N, m), 3-term subsets among the
    ``n_triple_set`` smallest terms and every third term on the ``n_extend`` best pairs."""
    K = kernels()
    N = len(U)
    yy = float(yc @ yc)
    b = np.ascontiguousarray(U @ yc)  # (N,)
    G = np.ascontiguousarray(U @ U.T)  # (N, N)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    L = max_lb + 1
    best_sse = np.full((L, n_best), np.inf)
    best_idx = np.full((L, n_best, 3), -1, dtype=np.int64)

    # ---- singles
    sse1 = yy - b**2
    pass1 = sse1 <= sse_pass
    passing = [Combo((int(i),), float(sse1[i]), int(sizes[i])) for i in np.flatnonzero(pass1)]
    for i in np.argsort(sse1, kind="stable"):
        if sizes[i] <= max_lb:
            K._offer(best_sse, best_idx, int(sizes[i]), float(sse1[i]), int(i), -1, -1)
    sse_min = float(sse1.min()) if N else yy

    # ---- pairs
    cap = 4 * max_pass
    out2 = np.zeros((cap, 2), dtype=np.int64)
    sse2 = np.zeros(cap)
    PP = np.zeros((N, N), dtype=np.bool_)
    top_sse = np.full(n_extend, np.inf)
    top_idx = np.full((n_extend, 2), -1, dtype=np.int64)
    n2 = K.pairs(G, b, yy, sizes, sse_pass, max_lb, pass1, best_sse, best_idx, out2, sse2, cap,
                 PP, top_sse, top_idx) if N >= 2 else 0
    passing += [Combo((int(i), int(j)), float(e), int(sizes[i] + sizes[j] + 1))
                for (i, j), e in zip(out2[:n2], sse2[:n2])]

    # ---- triples among the smallest terms, then a third term on the best pairs
    out3 = np.zeros((cap, 3), dtype=np.int64)
    sse3 = np.zeros(cap)
    T = np.arange(min(N, n_triple_set), dtype=np.int64)  # the library is ordered by size
    inT = np.zeros(N, dtype=np.bool_)
    inT[T] = True
    n3 = 0
    if N >= 3:
        n3 = K.triples(G, b, yy, T, sizes, sse_pass, max_lb, pass1, PP, best_sse, best_idx,
                       out3, sse3, 0, cap)
        n3 = K.extend(G, b, yy, top_idx, int(np.isfinite(top_sse).sum()), inT, sizes, sse_pass,
                      max_lb, pass1, PP, best_sse, best_idx, out3, sse3, n3, cap)
    seen = set()
    for t, e in zip(out3[:n3], sse3[:n3]):
        key = tuple(sorted(int(v) for v in t))
        if key not in seen:
            seen.add(key)
            passing.append(Combo(key, float(e), int(sizes[list(key)].sum() + 2)))

    finite = np.isfinite(best_sse)
    if finite.any():
        sse_min = min(sse_min, float(best_sse[finite].min()))
    best = [Combo(tuple(int(v) for v in best_idx[lb, r] if v >= 0), float(best_sse[lb, r]), lb)
            for lb in range(L) for r in range(n_best) if np.isfinite(best_sse[lb, r])]
    passing.sort(key=lambda c: (c.lb, c.sse))
    del passing[max_pass:]
    best.sort(key=lambda c: (c.lb, c.sse))
    return ScreenResult(passing, best, sse_min)


def sse_threshold(data, zs: np.ndarray, ws: np.ndarray, margin: float = SCREEN_MARGIN) -> float:
    """Screen threshold on the weighted sse of the screening points (values zs, weights ws) for
    an rmse over all points of at most margin * tolerance. When the screen is all fitting points
    the within-group sum of squares is part of every loss and is taken off."""
    full = len(data.screen) == len(data.yf)
    W_s = data.W if full else float(data.wf[data.screen].sum())
    out = (margin * data.thr) ** 2 * W_s
    if full:
        out = max(out - data.ssw, 0.0)
    zc = zs - np.dot(ws, zs) / ws.sum()
    return out + 1e-12 * float(np.dot(ws * zc, zc))  # the closed form loses ~1e-16: never tighter
