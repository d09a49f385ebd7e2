"""Which shapes get constants inside their nonlinearities, and in which order (see inner.py).

A: every small nonlinear library term (the N_INNER_SEEDS smallest) gets one inner constant in each
   place (c*s, s + c), u(x) also both (u(c*x + d)); x**c for positive inputs; the best multi-term
   screened combinations likewise; each is scored on a coarse grid (screening points).
B: the seeds that did best with one constant get two (c*s + d).
A': a short LM from the best grid points, so that coarse grids (two constants) are ranked by what
   they reach, not by where the grid fell; shapes within the noise are taken smallest first.
C: LM on all fitting points and snapping for the best, skipping shapes that cannot beat the
   simplest passing formula. Singles and multi-term combinations are ranked apart (extra terms
   always lower the loss).
"""
from __future__ import annotations

import numpy as np

from wtc.sr import inner
from wtc.sr.data import Data
from wtc.sr.expr import OPS, size
from wtc.sr.screen import sse_threshold

N_INNER_SEEDS = 200  # smallest nonlinear terms given one inner constant
N_INNER_SEEDS_2 = 16  # of those, the best given two
N_INNER_COMBOS = 6  # multi-term combinations given inner constants
N_INNER_POLISH = 24  # one-constant grid results given a short LM (half by size, half by loss)
N_INNER_REFINE = 8  # variants refined and snapped on all points (half as many combinations)


N_COMPOSITION_BASES = 12  # small polynomial terms s wrapped into u(s), 1/s, x/s, x*u(s)


def composition_seeds(trees: list, ops, k: int, max_complexity: int) -> list:
    """Nonlinearities around a product or a sum, built explicitly: the library keeps one form per
    function, so a/(a*b) is already 1/b and a*sin(a + b) may fall past its budget. For small
    polynomial terms s (a*b, a + b, a**2, ...): u(s) for the unary nonlinear operators, 1/s and
    x_i/s, and x_i*u(s); their inner constants (log(1 + a*b), a/(1 + a*b)) are fitted as any other."""
    poly = {"add", "sub", "mul", "sq"}

    def is_poly(t):
        return t[0] == "x" or (t[0] in poly and all(is_poly(ch) for ch in t[1:]))
    bases = [t for t in trees if t[0] != "x" and is_poly(t) and size(t) <= 3][:N_COMPOSITION_BASES]
    bases = [("x", i) for i in range(k)] + bases
    unary = [o for o in ops if OPS[o].arity == 1 and OPS[o].nonlinear and OPS[o].level < 99]
    xs = [("x", i) for i in range(k)]
    out = []
    for s_ in bases:
        wrapped = [(u, s_) for u in unary]
        if "div" in ops and s_[0] != "x":
            wrapped += [("div", ("1",), s_)] + [("div", x, s_) for x in xs]
        out += wrapped
        out += [("mul", x, w) for w in wrapped if w[0] != "div" for x in xs]
    return [t for t in dict.fromkeys(out) if size(t) + 2 <= max_complexity]


def inner_pass(last, data: Data, cands: list, fit: dict, deadline, max_complexity: int, ops=()) -> None:
    """Append the inner-constant candidates of the library/screen ``last`` to ``cands``.

    ``fit``: the fitting points' columns, memo, y and weights (shared with the linear stage)."""
    lib, kept, res = last
    sub = {"cols": data.cols("screen"), "y": data.yf[data.screen], "w": data.wf[data.screen], "memo": {}}
    trees = [lib.trees[i] for i in kept]
    sizes = np.asarray(lib.sizes)[kept]
    sse1 = _single_sse(lib.vals[kept][:, : len(data.screen)], sub["y"], sub["w"])
    pools: dict[str, list] = {"single": [], "combo": []}

    def run_jobs(pool, seed_terms, n_params):
        for j, term in enumerate(seed_terms):
            others = list(seed_terms[:j] + seed_terms[j + 1:])
            for v, n_p in inner.variants(term):
                if n_p != n_params:
                    continue
                if deadline.over():
                    return
                sse, starts, prob = inner.coarse(v, others, sub)
                if starts is not None:
                    pools[pool].append((sse, v, others, starts, prob, tuple(seed_terms)))

    # A: singles up to the size where ~N_INNER_SEEDS terms are reached, then combos
    small = [i for i in np.argsort(sizes, kind="stable") if sizes[i] + 2 <= max_complexity
             and inner.variants(trees[i])][:N_INNER_SEEDS]
    for i in small:
        run_jobs("single", (trees[i],), 1)
        if sizes[i] == 2:  # u(x): the one-neuron shape u(c*x + d) always gets both constants
            run_jobs("single", (trees[i],), 2)
    seen = {trees[i] for i in small}
    for t in composition_seeds(trees, ops, data.k, max_complexity):
        if t not in seen:
            run_jobs("single", (t,), 1)
    best_single = [trees[i] for i in np.argsort(sse1)[:2]]
    for shape in inner.power_shapes(data):
        for others in ([], *([t] for t in best_single)):
            sse, starts, prob = inner.coarse(shape, others, sub)
            if starts is not None:
                pools["single" if not others else "combo"].append(
                    (sse, shape, others, starts, prob, (shape, *others)))
    combos = [c for c in sorted(res.best, key=lambda c: c.sse) if len(c.terms) > 1
              and any(inner.variants(trees[i]) for i in c.terms)][:N_INNER_COMBOS]
    for c in combos:
        run_jobs("combo", tuple(trees[i] for i in c.terms), 1)
    # B: two constants on the seeds that did best with one
    for pool, n_seeds in (("single", N_INNER_SEEDS_2), ("combo", 3)):
        pools[pool].sort(key=lambda s: s[0])
        seeds = list(dict.fromkeys(s[5] for s in pools[pool]))[:n_seeds]
        for seed in seeds:
            if seed[0][0] != "pow" and not (len(seed) == 1 and len(seed[0]) == 2 and seed[0][1][0] == "x"):
                run_jobs(pool, seed, 2)
    # A': short LM; near the noise: smallest first
    sse_pass = sse_threshold(data, sub["y"], sub["w"])
    ranked: dict[str, list] = {}
    for pool in pools:
        jobs = [j for j in pools[pool] if j[3].shape[1] == 1]
        near = sorted((j for j in jobs if j[0] <= 100 * sse_pass), key=lambda j: (_job_size(j), j[0]))
        far = sorted((j for j in jobs if j[0] > 100 * sse_pass), key=lambda j: j[0])
        two = [j for j in pools[pool] if j[3].shape[1] == 2]  # coarse 2-D grids: all polished
        short = []
        for _, tree, others, starts, prob, _ in near[: N_INNER_POLISH // 2] + far[: N_INNER_POLISH // 2] + two:
            if deadline.over():
                return
            f, c = inner.polish(prob, starts[:2], iters=12)
            short.append((f, tree, others, c))
        ranked[pool] = sorted(short, key=lambda s: (s[0] > 1.2 * sse_pass, _job_size(s), s[0]))
    # C: LM on all points and snapping, skipping what cannot beat the simplest passing formula
    for pool, n in (("single", N_INNER_REFINE), ("combo", N_INNER_REFINE // 2)):
        for f, tree, others, c0 in ranked[pool][:n]:
            b = min((c.complexity for c in cands if c.passes), default=None)
            if deadline.over():
                return
            if b is not None and _job_size((f, tree, others)) > b:
                continue
            c = inner.refine(tree, others, c0, data, fit)
            if c is not None:
                cands.append(c)


def _job_size(job) -> int:
    """Nodes of the parametrised term and its companions: a lower bound of the formula's size."""
    tree, others = job[1], job[2]
    return size(tree) + sum(size(o) + 1 for o in others)


def _single_sse(vals: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    W = w.sum()
    with np.errstate(all="ignore"):
        vc = vals - (vals @ w)[:, None] / W
        yc = y - np.dot(w, y) / W
        num = (vc * w) @ yc
        den = np.einsum("nm,nm,m->n", vc, vc, w)
        sse = np.dot(w * yc, yc) - num**2 / den
    return np.where(np.isfinite(sse) & (den > 0), sse, np.inf)
