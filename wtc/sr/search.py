"""The search: operator levels, growing libraries, linear screen, inner constants, early stop.

For each operator level ({+,-,*,square} -> +{/,max,min,abs,relu} -> +{neg,sqrt,exp,log,sin,cos,
tanh}), libraries of growing size are enumerated and screened; combinations that pass the screen
are refit and snapped in order of their complexity lower bound, stopping as soon as nothing left
can beat the simplest passing formula. The next level is tried only when nothing passed, or when
what passed is still large (complexity > SIMPLE_ENOUGH). Only then do the levels with nonlinear
operators get the (costlier) inner-constant pass, in the same order. The simplest passing formula
over everything tried wins.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from wtc.sr import inner, transforms
from wtc.sr.data import Data
from wtc.sr.enumeration import enumerate_library
from wtc.sr.expr import LEVELS, OPS, level_ops, size
from wtc.sr.fitting import Candidate, fit_terms
from wtc.sr.screen import prepare_columns, screen

TERM_BUDGETS = (250, 2500)  # library sizes tried per level, smallest first
SCREEN_MARGIN = 1.5  # the screen lets through rmse <= SCREEN_MARGIN * tolerance
SIMPLE_ENOUGH = 9  # a passing formula this small ends the widening of operator sets
TRANSFORM_IF_ABOVE = 5  # ... and the transformed-target pass unless it is at most this small
MAX_REFITS = 60  # full refits of passing combinations per library
N_INNER_SEEDS = 200  # smallest nonlinear terms given one inner constant
N_INNER_SEEDS_2 = 16  # of those, the best given two
N_INNER_COMBOS = 6  # multi-term combinations given inner constants
N_INNER_POLISH = 24  # best grid results per pool given a short LM before ranking
N_INNER_REFINE = 8  # variants refined by LM after the grid (half as many combinations)


@dataclass
class SearchLog:
    levels_tried: list = field(default_factory=list)
    library_sizes: list = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0


class _Deadline:
    def __init__(self, limit: float | None):
        self.t0 = time.perf_counter()
        self.limit = limit

    def over(self) -> bool:
        return self.limit is not None and time.perf_counter() - self.t0 > self.limit


def op_levels(operators) -> list[tuple[str, ...]]:
    """Operator sets to try in order: staged ('auto'/None) or the user's list as one level."""
    if operators is None or (isinstance(operators, str) and operators == "auto"):
        return [level_ops(lv) for lv in LEVELS]
    if isinstance(operators, str):
        raise ValueError(f"operators must be None, 'auto' or a list of operator names, got {operators!r}")
    from wtc.sr.expr import resolve_ops
    ops = tuple(o for o in resolve_ops(operators) if o != "pow")
    return [tuple(dict.fromkeys(("add", "sub", "mul", *ops)))]


def run(data: Data, *, max_complexity: int, operators=None, time_limit: float | None = None,
        rng: np.random.Generator | None = None) -> tuple[list[Candidate], SearchLog]:
    """All candidates evaluated (the caller selects); the log says what was searched."""
    rng = np.random.default_rng(0) if rng is None else rng
    deadline = _Deadline(time_limit)
    log = SearchLog()
    cands: list[Candidate] = []
    fit = {"cols": data.cols("fit"), "memo": {}, "y": data.yf, "w": data.wf}
    const = fit_terms([], data)  # the constant model is always a candidate
    if const is not None:
        cands.append(const)
    # on 0/1 inputs every operator set can express every function: the first that passes is it
    simple_enough = SIMPLE_ENOUGH if len(data.binary) < data.k else 10**9

    def best_passing():
        ok = [c for c in cands if c.passes and c.complexity <= max_complexity]
        return min(ok, key=lambda c: (c.complexity, c.dl, c.rmse)) if ok else None

    def done(enough: int = simple_enough) -> bool:
        b = best_passing()
        return (b is not None and b.complexity <= enough) or deadline.over()

    screens = []  # (ops, (library, kept, screen)) per level, for the later passes
    if not done():
        # 1. linear combinations of enumerated terms, operator level by level
        for ops in op_levels(operators):
            log.levels_tried.append(ops)
            last = None
            for budget in TERM_BUDGETS:
                if deadline.over():
                    break
                lib = enumerate_library(data.probes, len(data.screen), ops, max_size=max_complexity,
                                        max_terms=budget, target=data.yf[data.screen], rng=rng)
                last = _linear(lib, data, None, cands, fit, best_passing, deadline, max_complexity)
                log.library_sizes.append((len(lib), len(last[1]), lib.complete_size))
                b = best_passing()
                if b is not None and b.complexity <= lib.complete_size + 1:
                    break  # anything not yet seen has a bigger term, so it cannot be simpler
                if lib.complete_size >= max_complexity:
                    break
            if last is not None:
                screens.append((ops, last))
            if done():
                break
    # 2. the same libraries against a transformed target (1/y, y^2): cheap, so tried unless what
    # passed is already smaller than what a transform can give
    small = min(simple_enough, TRANSFORM_IF_ABOVE)
    for tr in (transforms.available(data) if not done(small) else []):
        for ops, (lib, _, _) in screens:
            if tr.wrap(("1",))[0] in ops and not done(small):
                _linear(lib, data, tr, cands, fit, best_passing, deadline, max_complexity)
                break
    # 3. constants inside nonlinearities, on the richest library (its small terms include the
    # smaller operator sets' shapes): costlier than a level, so last
    if screens and not done() and any(OPS[o].nonlinear for o in screens[-1][0]):
        _inner_pass(screens[-1][1], data, cands, fit["memo"], fit["cols"], deadline, max_complexity)
    if screens and not deadline.over():  # rows of the table from the richest operator set tried
        _pareto_rows(screens[-1][1], data, cands, fit["memo"], fit["cols"])
    log.timed_out = deadline.over()
    log.seconds = time.perf_counter() - deadline.t0
    return cands, log


def _linear(lib, data: Data, tr, cands, fit, best_passing, deadline, max_complexity):
    """Screen the library against y (or the transform's z) and refit what passes, simplest first."""
    s = data.screen
    z, w = (data.yf, data.wf) if tr is None else (tr.z, tr.w)
    zs, ws = z[s], w[s]
    U, zc, kept = prepare_columns(lib.vals[:, : len(s)], zs, ws)
    sizes = np.asarray(lib.sizes)[kept] + (tr.cost if tr is not None else 0)
    res = screen(U, zc, sizes, _sse_pass(data, zs, ws), max_lb=max_complexity)
    for n_fit, combo in enumerate(res.passing):
        b = best_passing()
        if (b is not None and combo.lb > b.complexity) or n_fit >= MAX_REFITS or deadline.over():
            break
        c = fit_terms([lib.trees[kept[i]] for i in combo.terms], data, memo=fit["memo"],
                      cols=fit["cols"], bound=b.complexity if b is not None else None, transform=tr)
        if c is not None:
            cands.append(c)
    return lib, kept, res


def _sse_pass(data: Data, zs: np.ndarray, ws: np.ndarray) -> float:
    """Screen threshold on the weighted sse of the screening points: rmse <= SCREEN_MARGIN * tol."""
    full = len(data.screen) == len(data.yf)
    W_s = float(data.wf[data.screen].sum()) if not full else data.W
    out = (SCREEN_MARGIN * data.thr) ** 2 * W_s
    if full:
        out = max(out - data.ssw, 0.0)
    zc = zs - np.dot(ws, zs) / ws.sum()
    return out + 1e-12 * float(np.dot(ws * zc, zc))  # the closed form loses ~1e-16: never tighter


def _simple_enough(best: Candidate | None) -> bool:
    """Stop widening: a passing formula small enough that a richer operator set is unlikely to
    beat it. Larger ones (often polynomial stand-ins for exp, x**1.5, ...) keep the search going
    and compete on complexity with what the next level finds."""
    return best is not None and best.complexity <= SIMPLE_ENOUGH


def _pareto_rows(last, data, cands, memo, cols, per_lb: int = 1):
    """Refit the best screened combination per complexity bound (rows of the equations table)."""
    lib, kept, res = last
    done = {c.terms for c in cands}
    seen_lb: dict[int, int] = {}
    for combo in res.best:
        if seen_lb.get(combo.lb, 0) >= per_lb:
            continue
        terms = tuple(lib.trees[kept[i]] for i in combo.terms)
        if terms in done:
            continue
        seen_lb[combo.lb] = seen_lb.get(combo.lb, 0) + 1
        c = fit_terms(list(terms), data, memo=memo, cols=cols)
        if c is not None:
            cands.append(c)


def _inner_pass(last, data: Data, cands, memo, cols, deadline, max_complexity):
    """Inner constants on the small nonlinear shapes (singles) and the best multi-term fits.

    A: one-constant variants of every small nonlinear term (and x**c) on a coarse grid;
    B: two-constant variants of the best A seeds; C: LM + snapping of the best of A and B,
    singles and multi-term combinations ranked apart (extra terms always lower the loss)."""
    lib, kept, res = last
    sub = {"cols": data.cols("screen"), "y": data.yf[data.screen], "w": data.wf[data.screen], "memo": {}}
    fit = {"cols": cols, "memo": memo, "y": data.yf, "w": data.wf}
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
    # A': a short LM on the screening points from the best grid points, so that coarse grids
    # (two constants) are ranked by what they can reach, not by where the grid happened to fall.
    # Several shapes often come within the noise: the near ones are taken smallest first.
    sse_pass = _sse_pass(data, sub["y"], sub["w"])
    ranked: dict[str, list] = {}
    for pool in pools:
        jobs = [j for j in pools[pool] if j[3].shape[1] == 1]
        near = sorted((j for j in jobs if j[0] <= 100 * sse_pass), key=lambda j: (_job_size(j), j[0]))
        far = sorted((j for j in jobs if j[0] > 100 * sse_pass), key=lambda j: j[0])
        two = [j for j in pools[pool] if j[3].shape[1] == 2]  # coarse 2-D grids: all polished
        short = []
        for sse, tree, others, starts, prob, _ in near[: N_INNER_POLISH // 2] + far[: N_INNER_POLISH // 2] + two:
            if deadline.over():
                return
            f, c = inner.polish(prob, starts[:2], iters=12)
            short.append((f, tree, others, c))
        ranked[pool] = sorted(short, key=lambda s: (s[0] > 1.2 * sse_pass, _job_size(s), s[0]))
    # C: LM on all fitting points and snapping for the best; stop at the first that passes when
    # nothing after it can be simpler
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
