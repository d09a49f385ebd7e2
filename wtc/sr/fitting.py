"""Refit a set of terms on all fitting points, snap the coefficients, build the candidate formula.

y ~ theta0 + sum_j theta_j g_j is solved by weighted least squares; each theta is then snapped to
the simplest number within a few standard errors (wtc.sr.numbers), one at a time, cheapest first,
refitting the still-free ones after every snap and keeping a snap only while the formula still
meets the acceptance level (the tolerance, or 1% above the unsnapped loss when the formula does not
pass anyway). Coefficients snapped to 0 drop their term; 1 and -1 drop their multiplication.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wtc import lapack
from wtc.sr import numbers as nb
from wtc.sr.data import REL_FLOOR, Data
from wtc.sr.expr import const_cost, evaluate, size

Z_SNAP = 3.0  # snap within Z_SNAP standard errors


def snap_width(data: Data, r0: float) -> tuple[float, float]:
    """(sigma behind the standard errors, z) for snapping. With an estimated noise level the
    interval is statistical (Z_SNAP standard errors). With a user tolerance it also covers every
    value that alone keeps the rmse within the tolerance: the user asked for the simplest formula
    within tol, not for the statistically best constants."""
    floor = REL_FLOOR * max(data.y_rms, 1e-300)
    sig = max(r0, floor)
    z = Z_SNAP
    if data.sigma_method == "tol":
        z = max(Z_SNAP, float(np.sqrt(max(data.thr**2 - r0**2, 0.0) * data.W)) / sig)
    return sig, z


@dataclass
class Candidate:
    tree: tuple  # final formula, constants as ("k", Num) leaves
    complexity: int
    rmse: float  # over all n points
    passes: bool
    dl: float  # description length: complexity + digits of the constants (tie-breaker)
    source: str = "linear"
    terms: tuple = field(default=(), repr=False)  # the library terms it was built from
    max_err: float = 0.0  # largest |y_i - f(x_i)| over the points behind the fitting points

    @property
    def loss(self) -> float:
        return self.rmse**2


def _wls(F: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Weighted least squares; returns (theta, unscaled covariance (F'WF)^-1) or None."""
    sw = np.sqrt(w)[:, None]
    A = F * sw
    try:
        theta = lapack.lstsq(A, y * sw[:, 0])
        with np.errstate(over="ignore", invalid="ignore"):
            gram = A.T @ A              # it can overflow where A does not: pinv refuses it then
        cov = lapack.pinv(gram)
    except np.linalg.LinAlgError:
        return None
    return theta, cov


def snap_coefficients(F: np.ndarray, data: Data, *, base_size: int = 0, bound: int | None = None,
                      transform=None):
    """Fit and snap the coefficients of the columns of F (M, p) (column 0 is the constant one).

    Returns (list of Num, rmse), or None when the columns are unusable, or when the formula would
    pass but clearly not beat complexity ``bound`` (``base_size``: nodes of the terms and sums).
    With a ``transform`` (wtc.sr.transforms) the fit is on its z and w, the rmse on y."""
    y, w = (data.yf, data.wf) if transform is None else (transform.z, transform.w)
    back = (lambda z: z) if transform is None else transform.back

    def errs(z):
        """(rmse, max error) of the prediction z (in the fitted units) on y."""
        with np.errstate(all="ignore"):
            pred = back(z)
        if not np.all(np.isfinite(pred)):
            return np.inf, np.inf
        return data.rmse(pred), data.max_err(pred)

    floor = REL_FLOOR * max(data.y_rms, 1e-300)
    p = F.shape[1]
    fixed: dict[int, nb.Num] = {}

    def refit():
        free = [j for j in range(p) if j not in fixed]
        r = y - sum((F[:, j] * fixed[j].value for j in fixed), np.zeros_like(y))
        theta = np.zeros(p)
        cov = np.zeros((p, p))
        if free:
            sol = _wls(F[:, free], r, w)
            if sol is None:
                return None
            theta[free], cov[np.ix_(free, free)] = sol
        for j, v in fixed.items():
            theta[j] = v.value
        return theta, cov, errs(F @ theta)

    out = refit()
    if out is None or not np.isfinite(out[2][0]):
        return None
    theta, cov, (r0, m0) = out
    passing = r0 <= data.thr and m0 <= data.max_err_allowed
    # a snap is kept while the formula still passes (rms and every point), else while the rms
    # stays within 1% of the unsnapped fit
    accept = data.thr if passing else r0 * 1.01 + floor

    def acceptable(e):
        return e[0] <= accept and (not passing or e[1] <= data.max_err_allowed)
    sig, z = snap_width(data, r0)
    if bound is not None:
        # cheap estimate of the snapped complexity: a coefficient costs 2 nodes unless it can be
        # +-1 (0 for theta0); a coefficient that can be 0 removes its term (at least 1 node)
        se = sig * np.sqrt(np.maximum(np.diag(cov), 0.0))

        def near(v, j):
            return abs(theta[j] - v) <= z * se[j]

        est = base_size + (0 if near(0, 0) else 2)
        est += sum(-1 if near(0, j) else 0 if (near(1, j) or near(-1, j)) else 2 for j in range(1, p))
        if est > bound:
            return None
    while len(fixed) < p:
        free = [j for j in range(p) if j not in fixed]
        options = {j: nb.snap_options(theta[j], sig * np.sqrt(max(cov[j, j], 0.0)), z) for j in free}
        order = sorted(free, key=lambda j: (options[j][0].cost, j))
        accepted = False
        for j in order:
            for opt in options[j][:-1]:  # the simple options; the rounded float is the fallback
                fixed[j] = opt
                trial = refit()
                if trial is not None and acceptable(trial[2]):
                    theta, cov, _ = trial
                    accepted = True
                    break
                del fixed[j]
            if accepted:
                break
        if not accepted:
            for j in free:  # nothing simple fits: keep the fitted values, rounded to their precision
                fixed[j] = options[j][-1]
            break
    theta = np.array([fixed[j].value for j in range(p)])
    return [fixed[j] for j in range(p)], errs(F @ theta)


def linear_tree(nums: list, terms: list) -> tuple:
    """theta0 + sum theta_j g_j as a tree with the fewest nodes (signs folded into add/sub)."""
    parts = [(n, t) for n, t in zip(nums[1:], terms) if n.value != 0]
    acc = None
    for n, t in parts:
        neg = n.value < 0
        mag = n if not neg else _negate(n)
        piece = t if mag.value == 1 else ("mul", ("k", mag), t)
        if acc is None:
            acc = ("neg", piece) if neg else piece
        else:
            acc = ("sub" if neg else "add", acc, piece)
    c0 = nums[0]
    if acc is None:
        return ("k", c0)
    if c0.value != 0:
        acc = ("sub", acc, ("k", _negate(c0))) if c0.value < 0 else ("add", acc, ("k", c0))
    return acc


def _negate(n: nb.Num) -> nb.Num:
    text = n.text[1:] if n.text.startswith("-") else "-" + n.text
    return nb.Num(-n.value, lambda: -n.sym, text, n.cost, n.exact)


def fit_terms(terms: list, data: Data, source: str = "linear", memo: dict | None = None,
              cols: list | None = None, bound: int | None = None, transform=None) -> Candidate | None:
    """Candidate formula theta0 + sum theta_j g_j for library terms (trees) on the fitting points."""
    cols = data.cols("fit") if cols is None else cols
    memo = {} if memo is None else memo
    F = [np.ones(len(data.yf))]
    for t in terms:
        v = np.broadcast_to(evaluate(t, cols, memo=memo), data.yf.shape)
        if not np.all(np.isfinite(v)):
            return None
        F.append(v)
    base = sum(size(t) for t in terms) + max(len(terms) - 1, 0) + (transform.cost if transform else 0)
    snapped = snap_coefficients(np.stack(F, 1), data, base_size=base, bound=bound, transform=transform)
    if snapped is None:
        return None
    nums, (rmse, max_err) = snapped
    if not np.isfinite(rmse):
        return None
    tree = linear_tree(nums, list(terms))
    if transform is not None:
        tree = transform.wrap(tree)
        source = f"{source}+{transform.name}"
    c = size(tree)
    passes = rmse <= data.thr and max_err <= data.max_err_allowed
    return Candidate(tree, c, rmse, passes, c + 0.1 * const_cost(tree), source, tuple(terms), max_err)
