"""How noisy is y? A model-free estimate of the noise standard deviation, used to set the tolerance.

Two estimators, both independent of any candidate formula:
- replicates: when inputs repeat (bits, small integer grids), the pooled within-group standard
  deviation of y is the noise, exactly;
- local fits: otherwise, for a few hundred query points, fit a local quadratic (linear when k = 3
  has too few neighbours) to the nearest neighbours without the point and take the standardised
  prediction error; a robust scale (median absolute value) of those ignores kinks (max, abs).
The local estimate is biased upwards where the function curves faster than the sampling resolves,
so it errs on the side of a looser tolerance. Smooth systematic errors (a network's approximation
error) are invisible to both: pass ``tol`` when you know the error level.
"""
from __future__ import annotations

import numpy as np

# Rows the neighbour searches look among: a query's distances to every row cost (queries x n), so
# 10^6 rows took minutes; the nearest of 20000 random rows are near enough for a noise scale
# (farther neighbours bias the local estimate upwards: a looser tolerance, the safe side).
NEIGHBOUR_ROWS = 20000


def _among(n: int, rng: np.random.Generator) -> np.ndarray | None:
    """The rows a neighbour search looks among (sorted), or None for all of them."""
    return None if n <= NEIGHBOUR_ROWS else np.sort(rng.choice(n, NEIGHBOUR_ROWS, replace=False))


def group_rows(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique rows of X (G, k), the group index of every row (n,) and group counts (G,)."""
    uniq, inv, counts = np.unique(X, axis=0, return_inverse=True, return_counts=True)
    return uniq, inv.reshape(-1), counts


def replicate_sigma(y: np.ndarray, inv: np.ndarray, counts: np.ndarray) -> tuple[float, int]:
    """Pooled within-group std and its degrees of freedom."""
    means = np.bincount(inv, weights=y) / counts
    ssw = float(np.sum((y - means[inv]) ** 2))
    dof = len(y) - len(counts)
    return (np.sqrt(ssw / dof) if dof > 0 else 0.0), dof


def _design(D: np.ndarray, quadratic: bool) -> np.ndarray:
    """Local polynomial features of displacements D (..., k)."""
    feats = [np.ones(D.shape[:-1]), *np.moveaxis(D, -1, 0)]
    if quadratic:
        k = D.shape[-1]
        feats += [D[..., i] * D[..., j] for i in range(k) for j in range(i, k)]
    return np.stack(feats, axis=-1)


def local_sigma(X: np.ndarray, y: np.ndarray, rng: np.random.Generator, n_query: int = 400) -> float:
    rows = _among(len(X), rng)
    if rows is not None:
        X, y = X[rows], y[rows]
    n, k = X.shape
    scale = X.std(axis=0)
    scale[scale == 0] = 1.0
    Z = X / scale
    p_quad = 1 + k + k * (k + 1) // 2
    quadratic = n >= 8 * p_quad
    p = p_quad if quadratic else 1 + k
    K = min(n - 1, 2 * p + 2)
    if K <= p:
        return 0.0
    q = rng.choice(n, size=min(n_query, n), replace=False)
    errs = []
    for chunk in np.array_split(q, max(1, len(q) // 100)):
        d2 = ((Z[chunk, None, :] - Z[None, :, :]) ** 2).sum(-1)  # (c, n)
        d2[np.arange(len(chunk)), chunk] = np.inf  # leave the point out
        nb = np.argpartition(d2, K, axis=1)[:, :K]  # (c, K)
        D = Z[nb] - Z[chunk, None, :]  # (c, K, k) displacements
        A = _design(D, quadratic)  # (c, K, p)
        AtA = A.transpose(0, 2, 1) @ A + 1e-10 * np.eye(p)
        Aty = A.transpose(0, 2, 1) @ y[nb][..., None]
        with np.errstate(all="ignore"):
            sol = np.linalg.solve(AtA, Aty)[..., 0]  # (c, p); prediction at the point = sol[:, 0]
            inv00 = np.linalg.solve(AtA, np.broadcast_to(np.eye(p)[:, :1], (len(chunk), p, 1)))[:, 0, 0]
        e = (y[chunk] - sol[:, 0]) / np.sqrt(1.0 + inv00)  # var(y0 - yhat0) = s^2 (1 + e0'(A'A)^-1 e0)
        errs.append(e[np.isfinite(e)])
    e = np.concatenate(errs)
    if e.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(e - np.median(e))))


def estimate_sigma(X: np.ndarray, y: np.ndarray, rng: np.random.Generator | None = None) -> dict:
    """Noise std of y given X; returns {'sigma', 'method', 'dof'}."""
    rng = np.random.default_rng(0) if rng is None else rng
    _, inv, counts = group_rows(X)
    s_rep, dof = replicate_sigma(y, inv, counts)
    if dof >= 20 and dof >= 0.2 * len(y):
        return {"sigma": s_rep, "method": "replicates", "dof": dof}
    return {"sigma": local_sigma(X, y, rng), "method": "local-quadratic", "dof": len(y)}


STRUCTURE_Z = 5.0  # |correlation| * sqrt(n) of residuals with their k-th neighbours' above this: structure


def neighbour_index(X: np.ndarray, rng: np.random.Generator, k: int = 6, n_query: int = 400):
    """(query rows (q,), their k nearest other rows (q, k), nearest first) in per-column scaled X
    (among NEIGHBOUR_ROWS random rows when X has more; indices are X's own)."""
    rows = _among(len(X), rng)
    if rows is not None:
        q, nb = neighbour_index(X[rows], rng, k, n_query)
        return rows[q], rows[nb]
    n = len(X)
    scale = X.std(axis=0)
    scale[scale == 0] = 1.0
    Z = X / scale
    k = min(k, n - 1)
    q = np.sort(rng.choice(n, size=min(n_query, n), replace=False))
    out = []
    for chunk in np.array_split(q, max(1, len(q) // 100)):
        d2 = ((Z[chunk, None, :] - Z[None, :, :]) ** 2).sum(-1)
        d2[np.arange(len(chunk)), chunk] = np.inf
        nb = np.argpartition(d2, k - 1, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(d2, nb, 1), axis=1, kind="stable")
        out.append(np.take_along_axis(nb, order, 1))
    return q, np.concatenate(out)


def residual_structure(r: np.ndarray, index) -> float:
    """How far the residuals r are from independent noise: the largest |z| over neighbour ranks j of
    the correlation between r_i and r at its j-th nearest neighbour (z = corr * sqrt(queries)). A
    right formula leaves noise (z ~ N(0, 1)); a smooth formula through a staircase or an
    alternating pattern leaves residuals that neighbours predict (z of tens)."""
    q, nb = index
    r = r - r.mean()
    ss = float(np.dot(r, r)) / len(r)
    if not ss > 0 or nb.size == 0:
        return 0.0
    c = (r[q][:, None] * r[nb]).mean(axis=0) / ss  # (k,)
    return float(np.max(np.abs(c)) * np.sqrt(len(q)))
