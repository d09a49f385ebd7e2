"""numba kernels of the linear screen (the hot loops): all pairs, triples, third-term extension.

Columns are centred and unit-norm, so with G = U U' and b = U y the residual sum of squares of a
subset S is yy - b_S' G_SS^-1 b_S, closed form for 2 and 3 terms. Each kernel keeps, per lower
bound of complexity lb, the n_best lowest sse (``best_*`` arrays indexed [lb, rank]) and appends
the subsets that pass ``sse_pass`` (up to ``cap``) to preallocated output arrays.
Compiled on first use and cached on disk (numba cache=True).
"""
from __future__ import annotations

import numpy as np
from numba import njit

_COLLINEAR = 1e-9


@njit(cache=True)
def _offer(best_sse, best_idx, lb, sse, i, j, q):
    """Insert (sse, i, j, q) into the sorted row best_sse[lb] if it is among the n_best."""
    nb = best_sse.shape[1]
    if sse >= best_sse[lb, nb - 1]:
        return
    r = nb - 1
    while r > 0 and best_sse[lb, r - 1] > sse:
        best_sse[lb, r] = best_sse[lb, r - 1]
        best_idx[lb, r, 0] = best_idx[lb, r - 1, 0]
        best_idx[lb, r, 1] = best_idx[lb, r - 1, 1]
        best_idx[lb, r, 2] = best_idx[lb, r - 1, 2]
        r -= 1
    best_sse[lb, r] = sse
    best_idx[lb, r, 0] = i
    best_idx[lb, r, 1] = j
    best_idx[lb, r, 2] = q


@njit(cache=True)
def pairs(G, b, yy, sizes, sse_pass, max_lb, pass1, best_sse, best_idx, out_idx, out_sse, cap,
          PP, top_sse, top_idx):
    """All pairs i < j. Fills PP[i, j] (pair passes), the best per lb, the passing non-redundant
    pairs (returns their count) and the overall top pairs (top_sse sorted ascending)."""
    N = G.shape[0]
    n_out = 0
    n_top = top_sse.shape[0]
    for i in range(N):
        bi = b[i]
        for j in range(i + 1, N):
            lb = sizes[i] + sizes[j] + 1
            if lb > max_lb:
                continue
            g = G[i, j]
            den = 1.0 - g * g
            if den <= _COLLINEAR:
                continue
            bj = b[j]
            sse = yy - (bi * bi + bj * bj - 2.0 * bi * bj * g) / den
            if sse <= sse_pass:
                PP[i, j] = True
                PP[j, i] = True
                if not pass1[i] and not pass1[j] and n_out < cap:
                    out_idx[n_out, 0] = i
                    out_idx[n_out, 1] = j
                    out_sse[n_out] = sse
                    n_out += 1
            _offer(best_sse, best_idx, lb, sse, i, j, -1)
            if sse < top_sse[n_top - 1]:
                r = n_top - 1
                while r > 0 and top_sse[r - 1] > sse:
                    top_sse[r] = top_sse[r - 1]
                    top_idx[r, 0] = top_idx[r - 1, 0]
                    top_idx[r, 1] = top_idx[r - 1, 1]
                    r -= 1
                top_sse[r] = sse
                top_idx[r, 0] = i
                top_idx[r, 1] = j
    return n_out


@njit(cache=True)
def _sse3(G, b, yy, i, j, q):
    """yy - b' A^-1 b for the 3x3 unit-diagonal Gram block of (i, j, q); inf when collinear."""
    a, c, e = G[i, j], G[i, q], G[j, q]
    # A = [[1, a, c], [a, 1, e], [c, e, 1]]; adjugate entries
    m00 = 1.0 - e * e
    m01 = c * e - a
    m02 = a * e - c
    m11 = 1.0 - c * c
    m12 = a * c - e
    m22 = 1.0 - a * a
    det = m00 + a * m01 + c * m02
    if det <= _COLLINEAR:
        return np.inf
    x, y_, z = b[i], b[j], b[q]
    q = (m00 * x * x + m11 * y_ * y_ + m22 * z * z + 2.0 * (m01 * x * y_ + m02 * x * z + m12 * y_ * z))
    return yy - q / det


@njit(cache=True)
def triples(G, b, yy, T, sizes, sse_pass, max_lb, pass1, PP, best_sse, best_idx, out_idx, out_sse,
            n_out, cap):
    """All triples of the index set T (sorted); a triple with a passing single or pair inside is
    redundant and not reported as passing. Returns the new count of passing subsets."""
    nt = T.shape[0]
    for a_ in range(nt):
        i = T[a_]
        for b_ in range(a_ + 1, nt):
            j = T[b_]
            if sizes[i] + sizes[j] + 3 > max_lb:
                continue
            for c_ in range(b_ + 1, nt):
                q = T[c_]
                lb = sizes[i] + sizes[j] + sizes[q] + 2
                if lb > max_lb:
                    continue
                sse = _sse3(G, b, yy, i, j, q)
                if sse == np.inf:
                    continue
                _offer(best_sse, best_idx, lb, sse, i, j, q)
                if sse <= sse_pass and n_out < cap and not (
                        pass1[i] or pass1[j] or pass1[q] or PP[i, j] or PP[i, q] or PP[j, q]):
                    out_idx[n_out, 0] = i
                    out_idx[n_out, 1] = j
                    out_idx[n_out, 2] = q
                    out_sse[n_out] = sse
                    n_out += 1
    return n_out


@njit(cache=True)
def extend(G, b, yy, top_idx, n_top, inT, sizes, sse_pass, max_lb, pass1, PP, best_sse, best_idx,
           out_idx, out_sse, n_out, cap):
    """Every third term q on each of the top pairs (skipping triples fully inside T, done above).
    The per-triple block repeats the one in `triples` on purpose: factored into an njit helper
    (even inline="always") the SR fits ran ~1.8x slower (3 fits x 3 formulas: 4.1-5.1 s -> 7.3-9.0 s)."""
    N = G.shape[0]
    for t in range(n_top):
        i, j = top_idx[t, 0], top_idx[t, 1]
        if i < 0:
            continue
        for q in range(N):
            if q == i or q == j or (inT[i] and inT[j] and inT[q]):
                continue
            lb = sizes[i] + sizes[j] + sizes[q] + 2
            if lb > max_lb:
                continue
            sse = _sse3(G, b, yy, i, j, q)
            if sse == np.inf:
                continue
            _offer(best_sse, best_idx, lb, sse, i, j, q)
            if sse <= sse_pass and n_out < cap and not (
                    pass1[i] or pass1[j] or pass1[q] or PP[i, j] or PP[i, q] or PP[j, q]):
                out_idx[n_out, 0] = i
                out_idx[n_out, 1] = j
                out_idx[n_out, 2] = q
                out_sse[n_out] = sse
                n_out += 1
    return n_out
