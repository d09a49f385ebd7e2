"""The search: operator levels, growing libraries, linear screen, transforms, inner constants.

1. For each operator level ({+,-,*,square} -> +{/,max,min,abs,relu} -> +{neg,sqrt,exp,log,sin,
   cos,tanh}) libraries of growing size are enumerated and screened; combinations that pass the
   screen are refit and snapped in order of their complexity lower bound, stopping as soon as
   nothing left can beat the simplest passing formula. The next level is tried only when nothing
   passed, or when what passed is still large (complexity > SIMPLE_ENOUGH: polynomial stand-ins
   for exp or x**1.5 must not end the search).
2. Unless something small passed, the same libraries are screened against 1/y and y^2.
3. Unless something simple passed, the richest library gets the inner-constant pass.
The caller selects: the simplest passing formula over everything tried wins.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from wtc.sr import transforms
from wtc.sr.data import Data
from wtc.sr.enumeration import enumerate_library
from wtc.sr.expr import INT, LEVELS, OPS, evaluate, level_ops, resolve_ops
from wtc.sr.fitting import Candidate, fit_terms
from wtc.sr.inner_search import inner_pass
from wtc.sr.screen import prepare_columns, screen, sse_threshold
from wtc.errors import SRError

TERM_BUDGETS = (250, 2500)  # library sizes tried per level, smallest first
SIMPLE_ENOUGH = 9  # a passing formula this small ends the widening of operator sets
TRANSFORM_IF_ABOVE = 5  # ... and the transformed-target pass unless it is at most this small
MAX_REFITS = 60  # full refits of passing combinations per library


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


def op_levels(operators, integer: bool = False) -> list[tuple[str, ...]]:
    """Operator sets to try in order: staged ('auto'/None) or the user's list as one level. On
    integer data (integer inputs, integer-valued target) the integer operators come second, before
    the smooth ones: x % 2 must be found before cos(pi*x) or a saturated tanh."""
    if operators is None or (isinstance(operators, str) and operators == "auto"):
        levels = [level_ops(lv) for lv in LEVELS]
        if integer:
            levels.insert(1, level_ops(INT))
        return levels
    if isinstance(operators, str):
        raise SRError(f"operators must be None, 'auto' or a list of operator names, got {operators!r}")
    ops = tuple(o for o in resolve_ops(operators) if o != "pow")
    return [tuple(dict.fromkeys(("add", "sub", "mul", *ops)))]


INT_CONST_MAX = 10  # moduli, divisors and thresholds 2..10 (and 0)


def integer_constants(data: Data, moduli: tuple = ()) -> tuple:
    """Right operands of the integer operators: 0 and 2..K, K from the inputs' range, then the
    caller's moduli past INT_CONST_MAX (a model's period of 15 makes `s % 15` a formula)."""
    top = int(min(INT_CONST_MAX, max(3, np.max(np.abs(data.Xf)) + 1))) if data.integer else INT_CONST_MAX
    return (0, *range(2, top + 1), *sorted({int(m) for m in moduli if m > INT_CONST_MAX}))


def run(data: Data, *, max_complexity: int, operators=None, time_limit: float | None = None,
        rng: np.random.Generator | None = None, moduli: tuple = ()) -> tuple[list[Candidate], SearchLog]:
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
    # (on integer data the integer operators are still tried: a + b + c >= 2 beats its polynomial)
    simple_enough = SIMPLE_ENOUGH if len(data.binary) < data.k else 10**9
    levels = op_levels(operators, data.integer)
    int_consts = integer_constants(data, moduli)

    def best_passing():
        ok = [c for c in cands if c.passes and c.complexity <= max_complexity]
        return min(ok, key=lambda c: (c.complexity, c.dl, c.rmse)) if ok else None

    def done(enough: int = simple_enough) -> bool:
        b = best_passing()
        return (b is not None and b.complexity <= enough) or deadline.over()

    screens = []  # (ops, (library, kept, screen)) per level, for the later passes
    if not done():
        # 1. linear combinations of enumerated terms, operator level by level
        for li, ops in enumerate(levels):
            if deadline.over():
                break
            if li > 0 and simple_enough > SIMPLE_ENOUGH and best_passing() is not None:
                if not (data.integer and "ge" in ops):  # bits: the integer reading is compared
                    break                                # with the polynomial's canonical form
            log.levels_tried.append(ops)
            if data.integer and "ge" in ops and len(data.Xf) <= TABLE_CELLS:
                _table_pass(data, ops, int_consts, cands, fit, max_complexity, rng)
            last = None
            for budget in TERM_BUDGETS:
                if deadline.over():
                    break
                lib = enumerate_library(data.probes, len(data.screen), ops, max_size=max_complexity,
                                        max_terms=budget, target=data.yf[data.screen], rng=rng,
                                        int_consts=int_consts)
                last = _linear(lib, data, None, cands, fit, best_passing, deadline, max_complexity)
                if budget == TERM_BUDGETS[0] and ("ge" in ops or (li == 0 and not data.integer and len(np.unique(data.yf)) == 2)):
                    _threshold_pass(lib, data, cands, fit, max_complexity)
                log.library_sizes.append((len(lib), len(last[1]), lib.complete_size))
                b = best_passing()
                if b is not None and b.complexity <= lib.complete_size + 1:
                    break  # anything not yet seen has a bigger term, so it cannot be simpler
                if lib.complete_size >= max_complexity:
                    break
            if last is not None:
                screens.append((ops, last))
            if done() and simple_enough <= SIMPLE_ENOUGH:
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
        inner_pass(screens[-1][1], data, cands, fit, deadline, max_complexity, ops=screens[-1][0])
    if screens and not deadline.over():  # rows of the table from the richest operator set tried
        _pareto_rows(screens[-1][1], data, cands, fit["memo"], fit["cols"])
    log.timed_out = deadline.over()
    log.seconds = time.perf_counter() - deadline.t0
    return cands, log


TABLE_CELLS = 64  # inputs with at most this many distinct rows get the exact-table pass
TABLE_TERMS = 6000
TABLE_REFITS = 8


def _table_pass(data: Data, ops, int_consts, cands, fit, max_complexity, rng) -> None:
    """Few distinct inputs: enumerate terms by their values on the whole table only (two forms
    equal on every cell are one; the smallest is kept), so far deeper than the general library,
    and accept a + b * term only where it is exact on every cell (rmse and every point within the
    tolerance, checked by fit_terms): the simplest such reading of the table."""
    M = len(data.Xf)
    lib = enumerate_library(data.Xf, M, ops, max_size=max_complexity, max_terms=TABLE_TERMS,
                            max_raw=2e7, target=data.yf, rng=rng, int_consts=int_consts)
    if not len(lib):
        return
    w = data.wf
    W = w.sum()
    V = lib.vals[:, :M]
    with np.errstate(all="ignore"):
        Vc = V - (V @ w)[:, None] / W
        yc = data.yf - np.dot(w, data.yf) / W
        gg = (Vc * Vc) @ w
        gy = Vc @ (w * yc)
        sse = float(np.dot(w * yc, yc)) - gy**2 / gg
    allowed = (data.thr**2) * W * 1.5 + 1e-12 * float(np.dot(w * yc, yc))
    ok = np.flatnonzero(np.isfinite(sse) & (gg > 1e-12) & (sse <= allowed))
    sizes = np.asarray(lib.sizes)
    for i in ok[np.argsort(sizes[ok], kind="stable")][:TABLE_REFITS]:
        c = fit_terms([lib.trees[i]], data, source="table", memo=fit["memo"], cols=fit["cols"])
        if c is not None:
            cands.append(c)
    for tree in _set_terms(data):
        c = fit_terms([tree], data, source="table", memo=fit["memo"], cols=fit["cols"])
        if c is not None:
            cands.append(c)


SET_VALUES = 12  # a detector read as x in {...} lists at most this many values


def _set_terms(data: Data) -> list:
    """("in", x_i, set) terms for a two-valued target that is a function of one input: the values
    where it is high, and where it is low (a + b * term either way; the smaller formula wins)."""
    levels = np.unique(data.yf)
    if len(levels) != 2:
        return []
    out = []
    for i in range(data.k):
        xi = data.Xf[:, i]
        values = np.unique(xi)
        high = [v for v in values if np.all(data.yf[xi == v] == levels[1])]
        low = [v for v in values if np.all(data.yf[xi == v] == levels[0])]
        if len(high) + len(low) != len(values):      # not a function of this input alone
            continue
        out += [("in", ("x", i), ("set", tuple(float(v) for v in s))) for s in (high, low) if 0 < len(s) <= SET_VALUES]
    return out


THRESHOLD_TERMS = 300  # the smallest library terms get a fitted threshold: (s >= c)
TWO_SPLIT_CUTS = 256  # ... or two, when the term takes at most this many distinct values


def _threshold_pass(lib, data: Data, cands, fit, max_complexity) -> None:
    """y = a + b * (s >= c) for a library term s and the best threshold c: for each of the
    smallest terms every split of its sorted values is scored at once (cumulative sums). A split
    that is exact within the tolerance gives c = the simplest number in (last value below, first
    value above] (an integer when there is one), and the candidate is refit by fit_terms."""
    from wtc.sr import numbers as nb
    w, yv = data.wf, data.yf
    W = float(w.sum())
    tot = float(np.dot(w, yv))
    sst = float(np.dot(w, yv * yv)) - tot**2 / W
    allowed = (data.thr**2) * W * 1.5 + 1e-12 * max(sst, 0.0)
    found = 0
    first = list(range(min(THRESHOLD_TERMS, len(lib))))
    for i in first + [c for c in lib.chains if c not in first]:   # (sum of a window >= c: a vote)
        t = lib.trees[i]
        if lib.sizes[i] + 2 > max_complexity:
            continue
        sv = np.broadcast_to(evaluate(t, fit["cols"], memo=fit["memo"]), yv.shape)
        if not np.all(np.isfinite(sv)):
            continue
        order = np.argsort(sv, kind="stable")
        s_sorted, w_s, y_s = sv[order], w[order], yv[order]
        cut = np.flatnonzero(np.diff(s_sorted) > 0)  # split after position cut
        if not cut.size:
            continue
        cw, cy, cyy = np.cumsum(w_s), np.cumsum(w_s * y_s), np.cumsum(w_s * y_s * y_s)
        w1, y1, yy1 = cw[cut], cy[cut], cyy[cut]
        w2, y2, yy2 = W - w1, tot - y1, cyy[-1] - yy1
        sse = (yy1 - y1**2 / w1) + (yy2 - y2**2 / w2)
        j = int(np.argmin(sse))
        if sse[j] <= allowed:
            splits = [j]
        elif lib.sizes[i] * 2 + 5 <= max_complexity and 2 <= len(cut) <= TWO_SPLIT_CUTS:
            # two thresholds, three levels (sign(x - 50) = (x >= 50) + (x >= 51) - 1): every pair
            # of cuts j1 < j2, segment sums from the cumulative sums
            ends = np.concatenate([[-1], cut, [len(s_sorted) - 1]])

            def seg(a, b):  # sse of sorted positions ends[a]+1 .. ends[b]
                def cs(c, e):
                    return np.where(e >= 0, c[np.maximum(e, 0)], 0.0)
                ww = cs(cw, ends[b]) - cs(cw, ends[a])
                yy_ = cs(cy, ends[b]) - cs(cy, ends[a])
                return (cs(cyy, ends[b]) - cs(cyy, ends[a])) - yy_**2 / ww
            n_c = len(cut)
            j1, j2 = np.triu_indices(n_c, 1)
            sse2 = seg(0, j1 + 1) + seg(j1 + 1, j2 + 1) + seg(j2 + 1, n_c + 1)
            best2 = int(np.argmin(sse2))
            if not sse2[best2] <= allowed:
                continue
            splits = [int(j1[best2]), int(j2[best2])]
        else:
            continue
        terms = []
        for j in splits:
            lo, hi = float(s_sorted[cut[j]]), float(s_sorted[cut[j] + 1])
            c = next((nb.integer(v) for v in range(int(np.floor(lo)) + 1, int(np.floor(hi)) + 1)), None)
            if c is None:
                c = nb.simplest_in(np.nextafter(lo, np.inf), hi, hi) or nb.rounded(hi, 0)
            terms.append(("ge", t[1], t[2]) if t[0] == "sub" and c.value == 0 else ("ge", t, ("k", c)))  # a - b >= 0
        cand = fit_terms(terms, data, source="threshold", memo=fit["memo"], cols=fit["cols"])
        if cand is not None:
            cands.append(cand)
            found += 1
            if found >= 4:
                break


def _linear(lib, data: Data, tr, cands, fit, best_passing, deadline, max_complexity):
    """Screen the library against y (or the transform's z) and refit what passes, simplest first."""
    s = data.screen
    z, w = (data.yf, data.wf) if tr is None else (tr.z, tr.w)
    zs, ws = z[s], w[s]
    U, zc, kept = prepare_columns(lib.vals[:, : len(s)], zs, ws)
    sizes = np.asarray(lib.sizes)[kept] + (tr.cost if tr is not None else 0)
    res = screen(U, zc, sizes, sse_threshold(data, zs, ws), max_lb=max_complexity)
    for n_fit, combo in enumerate(res.passing):
        b = best_passing()
        if (b is not None and combo.lb > b.complexity) or n_fit >= MAX_REFITS or deadline.over():
            break
        c = fit_terms([lib.trees[kept[i]] for i in combo.terms], data, memo=fit["memo"],
                      cols=fit["cols"], bound=b.complexity if b is not None else None, transform=tr)
        if c is not None:
            cands.append(c)
    return lib, kept, res


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
