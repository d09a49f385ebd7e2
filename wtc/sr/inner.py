"""Constants inside nonlinearities: exp(-0.5 x), sin(2x + 1), x**0.75, 1/(1 + 0.3 x^2).

The linear stage only fits outer coefficients. Here a shape (chosen by wtc.sr.inner_search) gets
one or two inner constants: the argument s of a nonlinear node becomes c*s, s + c or c*s + d (a
divisor or max/min argument gets s + c, max/min also c*s); x**c is its own shape. For given
inner constants the outer coefficients are a linear least-squares problem (variable projection),
so only the 1-2 inner constants are searched: a coarse grid on the screening points, then
Levenberg-Marquardt (numpy, finite-difference Jacobian) on all fitting points. Each inner
constant is then snapped like the outer ones (within Z_SNAP standard errors from the Gauss-Newton
covariance), trying every simple choice and keeping the one that gives the simplest passing
formula. sin/cos arguments are first put in canonical form (positive frequency, phase in
(-pi, pi], and the sin <-> cos twin with a phase shifted by pi/2 is tried too).
"""
from __future__ import annotations

import itertools

import numpy as np

from wtc import lapack
from wtc.sr import numbers as nb
from wtc.sr.data import Data
from wtc.sr.expr import OPS, evaluate, renumber, substitute
from wtc.sr.fitting import Candidate, fit_terms, snap_width

# grids per axis: (one constant, two constants); log-spaced scales of both signs, linear shifts
_MUL_GRID = (np.concatenate([-np.logspace(-1.5, 1.5, 33), np.logspace(-1.5, 1.5, 33)]),
             np.concatenate([-np.logspace(-1.5, 1.5, 13), np.logspace(-1.5, 1.5, 13)]))
_ADD_GRID = (np.linspace(-3.0, 3.0, 61), np.linspace(-3.0, 3.0, 25))
_POW_GRID = (np.linspace(-3.0, 3.0, 61), np.linspace(-3.0, 3.0, 25))


# ---------------------------------------------------------------------------------- shapes
def _paths(t, path=()):
    """Paths to nodes whose argument can take an inner constant."""
    out = []
    if t[0] in OPS:
        op = OPS[t[0]]
        if op.nonlinear and op.name != "pow":
            out.append(path)
        for i, ch in enumerate(t[1:], start=1):
            out += _paths(ch, path + (i,))
    return out


def _get(t, path):
    for i in path:
        t = t[i]
    return t


def _put(t, path, new):
    if not path:
        return new
    i = path[0]
    return t[:i] + (_put(t[i], path[1:], new),) + t[i + 1:]


_VARIANTS: dict = {}


def variants(term) -> list:
    """Parametrised versions of ``term`` (trees with ("c", j) leaves, renumbered from 0)."""
    hit = _VARIANTS.get(term)
    if hit is None:
        if len(_VARIANTS) > 200_000:
            _VARIANTS.clear()
        hit = _VARIANTS[term] = _variants(term)
    return hit


def _variants(term) -> list:
    out = []
    for path in _paths(term):
        node = _get(term, path)
        if len(node) == 2:  # unary u(s)
            s = node[1]
            for new_s in (("mul", ("c", 0), s), ("add", s, ("c", 0)),
                          ("add", ("mul", ("c", 0), s), ("c", 1))):
                out.append(_put(term, path, (node[0], new_s)))
        else:  # binary: shift either argument; scale either argument of max/min
            for i in (1, 2):
                arg = node[i]
                news = [("add", arg, ("c", 0))]
                if node[0] in ("max", "min"):
                    news.append(("mul", ("c", 0), arg))
                for new_arg in news:
                    out.append(_put(term, path, node[:i] + (new_arg,) + node[i + 1:]))
    return [(renumber(v)[0], renumber(v)[1]) for v in dict.fromkeys(out)]


def _grid(tree, p: int, s_scale: float) -> np.ndarray:
    """Initial grid (G, p) for the parameters of ``tree`` by their role (scale, shift, exponent)."""
    roles = _roles(tree)
    axes = []
    d = 0 if p == 1 else 1
    for j in range(p):
        r = roles.get(j, "add")
        axes.append(_MUL_GRID[d] if r == "mul" else _POW_GRID[d] if r == "pow" else _ADD_GRID[d] * s_scale)
    return np.array(list(itertools.product(*axes)))


def _roles(t, acc=None):
    acc = {} if acc is None else acc
    if t[0] in OPS:
        for ch in t[1:]:
            if ch[0] == "c":
                acc[ch[1]] = "mul" if t[0] == "mul" else "pow" if t[0] == "pow" else "add"
            else:
                _roles(ch, acc)
    return acc


# ---------------------------------------------------------------------------------- fitting
class _Problem:
    """Variable projection: y ~ [1, fixed terms..., f(c)] theta, sse as a function of c only.

    Only the last column depends on c, so with Q an orthonormal basis of the fixed columns
    (weighted) and r_y, r_v the parts of y and f(c) orthogonal to it:
        residual(c) = r_y - (r_v . r_y / r_v . r_v) r_v."""

    def __init__(self, tree, fixed_cols: list, cols, y, w, memo: dict | None = None):
        self.tree, self.cols, self.sw = tree, cols, np.sqrt(w)
        self.memo = {} if memo is None else memo
        base = np.stack([np.ones_like(y), *fixed_cols], 1) * self.sw[:, None]  # (M, q)
        self.Q = np.linalg.qr(base)[0]  # (M, q)
        yw = y * self.sw
        self.ry = yw - self.Q @ (self.Q.T @ yw)  # (M,)
        self.M = len(y)

    def residuals(self, C: np.ndarray) -> np.ndarray:
        """(G, M) weighted residuals after the best outer coefficients, inf where invalid."""
        params = [C[:, j:j + 1] for j in range(C.shape[1])]
        v = np.broadcast_to(evaluate(self.tree, self.cols, params, self.memo), (len(C), self.M))
        with np.errstate(all="ignore"):
            v = v * self.sw
            rv = v - (v @ self.Q) @ self.Q.T  # (G, M)
            vv = np.einsum("gm,gm->g", rv, rv)
            coef = (rv @ self.ry) / vv
            r = self.ry[None, :] - coef[:, None] * rv
        bad = ~np.isfinite(v).all(axis=1) | (np.abs(v) > 1e12).any(axis=1) | ~(vv > 1e-300)
        r[bad] = np.inf
        return r

    def sse(self, C):
        r = self.residuals(C)
        with np.errstate(all="ignore"):
            return np.where(np.isfinite(r).all(1), np.einsum("gm,gm->g", r, r), np.inf)


def levenberg_marquardt(prob: _Problem, c0: np.ndarray, free=None, iters: int = 60):
    """Minimise the varpro sse over the parameters ``free`` (others held); returns (c, sse, J)."""
    c = np.array(c0, dtype=float)
    free = list(range(len(c))) if free is None else list(free)
    r = prob.residuals(c[None])[0]
    f = float(r @ r) if np.isfinite(r).all() else np.inf
    J = None
    lam = 1e-3
    for _ in range(iters):
        if not free or not np.isfinite(f):
            break
        h = 1e-6 * (1 + np.abs(c[free]))
        Cs = np.repeat(c[None], len(free), 0)
        Cs[np.arange(len(free)), free] += h
        J = ((prob.residuals(Cs) - r[None]) / h[:, None]).T  # (M, d)
        if not np.isfinite(J).all():
            break
        A, g = J.T @ J, J.T @ r
        improved = False
        while lam < 1e12:
            step = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-12 * np.eye(len(free))), -g)
            c_new = c.copy()
            c_new[free] += step
            r_new = prob.residuals(c_new[None])[0]
            f_new = float(r_new @ r_new) if np.isfinite(r_new).all() else np.inf
            if f_new < f:
                improved = True
                break
            lam *= 4
        if not improved:
            break
        small = np.all(np.abs(step) <= 1e-10 * (1 + np.abs(c[free]))) or f - f_new <= 1e-14 * f
        c, r, f, lam = c_new, r_new, f_new, max(lam / 3, 1e-12)
        if small:
            break
    return c, f, J


def coarse(tree, others: list, sub: dict, n_starts: int = 3):
    """Grid search of the inner constants on the screening points: (best sse, start rows (S, p))."""
    p = renumber(tree)[1]
    s_vals = [evaluate(o, sub["cols"], memo=sub["memo"]) for o in others]
    prob = _Problem(tree, s_vals, sub["cols"], sub["y"], sub["w"], sub["memo"])
    scale = float(max(np.std(c) + np.abs(np.mean(c)) for c in sub["cols"]) + 1.0)
    grid = _grid(tree, p, scale)
    sse = prob.sse(grid)
    if not np.isfinite(sse).any():
        return np.inf, None, prob
    order = np.argsort(sse)[:n_starts]
    return float(sse[order[0]]), grid[order], prob


def polish(prob_s: _Problem, starts: np.ndarray, iters: int = 40):
    """LM from each start on the screening points; the best (sse, c)."""
    best = (np.inf, starts[0])
    for c0 in starts:
        c, f, _ = levenberg_marquardt(prob_s, c0, iters=iters)
        if f < best[0]:
            best = (f, c)
    return best


def refine(tree, others: list, c0: np.ndarray, data: Data, fit: dict):
    """Polish the inner constants from c0 on all fitting points with LM, then snap."""
    f_vals = [evaluate(o, fit["cols"], memo=fit["memo"]) for o in others]
    prob = _Problem(tree, f_vals, fit["cols"], fit["y"], fit["w"], fit["memo"])
    c, f, J = levenberg_marquardt(prob, c0)
    if not np.isfinite(f):
        return None
    best = _snap_inner(tree, c, J, prob, others, data, fit)
    alt = _swap_sin_cos(tree)
    if alt is not None and best is not None and best.passes:
        # cos(u + p) = sin(u + p + pi/2): the same fit, but one of the two phases may be simple
        tree2, shift = alt
        c2 = c.copy()
        for j, d in shift.items():
            c2[j] += d
        prob2 = _Problem(tree2, f_vals, fit["cols"], fit["y"], fit["w"], fit["memo"])
        c2, f2, J2 = levenberg_marquardt(prob2, c2, iters=5)
        other = _snap_inner(tree2, c2, J2, prob2, others, data, fit) if np.isfinite(f2) else None
        if other is not None and other.passes and (other.complexity, other.dl) < (best.complexity, best.dl):
            best = other
    return best


def _swap_sin_cos(t):
    """The tree with every phased sin <-> cos swapped and the phase shifts that keep it equal."""
    shift: dict = {}

    def go(u):
        if u[0] in ("sin", "cos") and u[1][0] == "add" and u[1][2][0] == "c":
            j = u[1][2][1]
            shift[j] = np.pi / 2 if u[0] == "cos" else -np.pi / 2
            return ("sin" if u[0] == "cos" else "cos", (u[1][0], go(u[1][1]), u[1][2]))
        if u[0] in OPS:
            return (u[0], *(go(ch) for ch in u[1:]))
        return u
    out = go(t)
    return (out, shift) if shift else None


def _candidate(tree, values: dict, others, data: Data, fit) -> Candidate | None:
    t = substitute(tree, values)
    return fit_terms([t, *others], data, source="inner-constant", memo=fit["memo"], cols=fit["cols"])


def _phase_params(t, acc=None) -> set:
    """Indices of parameters that are the additive phase of a sin/cos argument."""
    acc = set() if acc is None else acc
    if t[0] in OPS:
        if t[0] in ("sin", "cos") and t[1][0] == "add" and t[1][2][0] == "c":
            acc.add(t[1][2][1])
        for ch in t[1:]:
            _phase_params(ch, acc)
    return acc


def _frequency_params(t, acc=None) -> list:
    """(frequency, phase or None) parameter indices of sin/cos(c*s [+ d]) nodes."""
    acc = [] if acc is None else acc
    if t[0] in OPS:
        if t[0] in ("sin", "cos"):
            a = t[1]
            if a[0] == "mul" and a[1][0] == "c":
                acc.append((a[1][1], None))
            elif a[0] == "add" and a[1][0] == "mul" and a[1][1][0] == "c" and a[2][0] == "c":
                acc.append((a[1][1][1], a[2][1]))
        for ch in t[1:]:
            _frequency_params(ch, acc)
    return acc


def _snap_inner(tree, c, J, prob: _Problem, others, data: Data, fit) -> Candidate | None:
    """Snap inner constants one at a time; each time every simple choice of the parameter is tried
    (the others refit) and the one giving the simplest passing formula is kept."""
    p = len(c)
    c = c.copy()
    for i, j in _frequency_params(tree):  # sin(-u) = -sin(u), cos(-u) = cos(u): positive frequency
        if c[i] < 0:
            c[i] = -c[i]
            if j is not None:
                c[j] = -c[j]
    phases = _phase_params(tree)
    for j in phases:  # periodic: bring the phase into (-pi, pi]
        c[j] = (c[j] + np.pi) % (2 * np.pi) - np.pi
    raw = _candidate(tree, {j: nb.rounded(c[j], 0) for j in range(p)}, others, data, fit)
    if raw is None:
        return None
    r0 = raw.rmse
    if not raw.passes:  # cannot pass: not worth the snapping search, keep it as a table row
        return raw
    accept = data.thr
    sig, z = snap_width(data, r0)
    fixed: dict[int, nb.Num] = {}
    while len(fixed) < p:
        free = [j for j in range(p) if j not in fixed]
        cov = _cov(J, p, free)
        choices = {j: nb.snap_choices(c[j], sig * np.sqrt(cov.get(j, 0.0)), z) for j in free}
        for j in phases & set(free):  # sin(u + c) = -sin(u + c - pi): the outer sign absorbs it
            alt = (c[j] + 2 * np.pi) % (2 * np.pi) - np.pi
            extra = nb.snap_choices(alt, sig * np.sqrt(cov.get(j, 0.0)), z)
            choices[j] = sorted(choices[j] + extra, key=lambda n: n.cost)
        j = min(free, key=lambda j: choices[j][0].cost if choices[j] else np.inf)
        rest = [i for i in free if i != j]
        best = None
        for opt in choices[j]:
            c_try = c.copy()
            c_try[j] = opt.value
            J_try = None
            if rest:
                c_try, _, J_try = levenberg_marquardt(prob, c_try, free=rest, iters=10)
            trial = _candidate(tree, {**fixed, j: opt, **{i: nb.rounded(c_try[i], 0) for i in rest}},
                               others, data, fit)
            if trial is not None and trial.rmse <= accept and trial.passes:
                key = (trial.complexity, trial.dl, trial.rmse)
                if best is None or key < best[0]:
                    best = (key, opt, c_try, J_try)
        if best is None:
            for i in free:
                se = sig * np.sqrt(cov.get(i, 0.0))
                fixed[i] = nb.rounded(c[i], se)
            break
        _, opt, c, J_new = best
        fixed[j] = opt
        J = J_new if rest else J
    return _candidate(tree, fixed, others, data, fit)


def _cov(J, p, free) -> dict:
    """Unscaled variances of the free parameters from the Gauss-Newton matrix (J over ``free``)."""
    if J is None or J.shape[1] != len(free):
        return {j: 0.0 for j in free}
    A = J.T @ J
    try:
        d = np.diag(lapack.pinv(A))
    except np.linalg.LinAlgError:
        return {j: 0.0 for j in free}
    return {j: float(max(v, 0.0)) for j, v in zip(free, d)}


def power_shapes(data: Data) -> list:
    """x_i ** c for every input that is positive on the data (the exponent is the inner constant)."""
    return [("pow", ("x", i), ("c", 0)) for i in range(data.k) if data.X[:, i].min() > 0]

