"""Input checks and the three views of the data the search uses.

- fitting points: the data itself, or, when inputs repeat (bits, small integer grids), one row per
  distinct input with its count as weight and the mean y; the within-group sum of squares is kept
  so that every loss is still the loss over all n points;
- screening points (m ~ N_SCREEN): a subsample of the fitting points for the fast linear screen;
- probes: the screening points followed by off-distribution points (enumeration dedup).
"""
from __future__ import annotations

import keyword
from dataclasses import dataclass

import numpy as np

from wtc.sr.enumeration import off_distribution_points
from wtc.sr.noise_level import estimate_sigma, group_rows
from wtc.errors import SRError
from wtc.tasks.limits import plain_numbers

# the builtin enumeration is sized for the 1-3 inputs of a Discrete Transformer's sub-MLPs; up to
# 10 are accepted (scikit-learn style use), searched as deep in total, so shallower per input
MAX_INPUTS = 10
MIN_POINTS = 8
MAX_FIT_POINTS = 20_000
N_SCREEN = 128
N_OFF = 24
TOL_FACTOR = 1.3  # a formula passes when its rmse <= TOL_FACTOR * noise estimate (+ floor)
REL_FLOOR = 1e-9  # noise-free data: rmse below REL_FLOOR * rms(y) counts as exact
MAX_REL_NOISE = 0.1  # estimated noise above this fraction of rms(y): nothing can be certified
# A passing formula must also be close on every point, not only in rms: |y_i - f(x_i)| at most
# MAX_ERR_FACTOR * tolerance (Gaussian noise of std sigma stays below ~4.5 sigma over 20000 points;
# the tolerance is 1.3 sigma). A formula that misses a few points by more is not certified.
MAX_ERR_FACTOR = 6.0
QUANTISED_SIGMA = 0.05  # a local noise estimate above this many lattice steps is the lattice itself
STAIRCASE_STEPS = 2.0  # ... when neighbours differ by at most this many steps (median)
# Names a formula may print (sympy text, Python source, numpy code): a variable of that name would
# be read as the function or constant (names=("sin",) printed sin(sin)), so they are refused.
RESERVED_NAMES = frozenset({
    "sin", "cos", "tan", "tanh", "exp", "log", "sqrt", "Abs", "abs", "Max", "Min", "max", "min",
    "Mod", "mod", "floor", "ceiling", "FloorDiv", "Ge", "Eq", "Piecewise", "Heaviside", "sign",
    "pi", "E", "e", "I", "S", "N", "O", "Q", "oo", "zoo", "nan", "inf", "true", "false",
    "Integer", "Float", "Rational", "Symbol", "Function", "math", "numpy", "np", "sympy", "sp",
    "mpmath", "builtins", "float", "int", "bool", "complex", "round", "pow", "sum", "divmod",
    "lambda", "relu", "sq", "neg", "select", "where", "greater_equal", "equal", "floor_divide",
})


class SRDataTypeError(SRError, TypeError):
    """X or y holds values that are not numbers at all (strings, dicts): also a TypeError."""


def check_inputs(X, y, names=None, max_inputs: int = MAX_INPUTS) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Validate and normalise (X (n, k), y (n,), names); raise SRError naming the problem."""
    for what, v in (("X", X), ("y", y)):
        if hasattr(v, "tocsr") or hasattr(v, "todense"):
            raise SRError(f"{what} is a sparse matrix: sparse input is not supported, pass a dense array")
        try:
            a = np.asarray(v)
        except (TypeError, ValueError) as e:   # ragged nested lists
            raise SRError(f"{what} must be a numeric array: {e}") from None
        if a.dtype.kind == "c" or (a.dtype == object and any(isinstance(u, complex) for u in a.ravel()[:1000])):
            raise SRError(f"{what} is complex (Complex data not supported); symbolic regression fits real numbers")
    X, y = plain_numbers(X, "X", SRError), plain_numbers(y, "y", SRError)   # text, dates, masks (lists too)
    for what, v in (("X", X), ("y", y)):
        if getattr(getattr(v, "dtype", None), "kind", "") == "V":
            raise SRError(f"{what} must be numeric, got an array of dtype {v.dtype}")
    try:
        X = np.asarray(X, dtype=np.float64)
    except TypeError as e:
        raise SRDataTypeError(f"X must be a numeric array of shape (n, k): {e}") from None
    except ValueError as e:
        raise SRError(f"X must be a numeric array of shape (n, k): {e}") from None
    try:
        y = np.asarray(y, dtype=np.float64)
    except TypeError as e:
        raise SRDataTypeError(f"y must be a numeric array of shape (n,): {e}") from None
    except ValueError as e:
        raise SRError(f"y must be a numeric array of shape (n,): {e}") from None
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise SRError(f"X must have shape (n, k) or (n,), got shape {X.shape}")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise SRError(f"y must have shape (n,), got shape {y.shape} (one output at a time)")
    if len(X) != len(y):
        raise SRError(f"X and y disagree on the number of points: X has {len(X)} rows, y has {len(y)}")
    n, k = X.shape
    if k == 0:
        raise SRError(f"X has no input columns: 0 feature(s) (shape=({n}, 0)) while a minimum of 1 is required.")
    if k > max_inputs:
        raise SRError(f"at most {max_inputs} inputs are supported here, X has k = {k}"
                         + (" (backend='pysr' takes more)" if max_inputs == MAX_INPUTS else ""))
    if n < MIN_POINTS:
        raise SRError(f"too few points: got n_samples = {n}, need at least {MIN_POINTS}")
    bad_x = ~np.isfinite(X)
    if bad_x.any():
        r, c = np.argwhere(bad_x)[0]
        raise SRError(f"X contains {int(bad_x.sum())} non-finite values (NaN/inf), first at row {r}, column {c}")
    tiny = (X != 0) & (np.abs(X) < np.finfo(np.float64).tiny)
    if tiny.any():      # a formula in such inputs needs coefficients past float64's max (1/2.2e-308)
        r, c = np.argwhere(tiny)[0]
        raise SRError(f"X holds subnormal values (|x| < 2.2e-308, e.g. {X[r, c]:.3g} at row {r}, column {c}): too "
                      "small for float64 arithmetic (a formula's coefficients would overflow); rescale X")
    bad_y = ~np.isfinite(y)
    if bad_y.any():
        raise SRError(f"y contains {int(bad_y.sum())} non-finite values (NaN/inf), first at row "
                         f"{int(np.flatnonzero(bad_y)[0])}")
    names = check_names(names, k)
    return X, y, names


def check_names(names, k: int) -> tuple:
    """Variable names: None (x or x0, x1, ...), or k distinct identifiers that no formula prints
    as a function or constant; one name may be given as a plain string when k = 1."""
    if names is None:
        return tuple(f"x{i}" for i in range(k)) if k > 1 else ("x",)
    if isinstance(names, str):
        if k != 1:
            raise SRError(f"names must be a sequence of {k} strings (one per column of X), got the single string {names!r}")
        names = (names,)
    try:
        names = tuple(names)
    except TypeError:
        raise SRError(f"names must be a sequence of strings, one per column of X (k = {k}), got {names!r}") from None
    for s in names:
        if not isinstance(s, str):
            raise SRError(f"variable names must be strings, got {s!r} ({type(s).__name__})")
    names = tuple(str(s) for s in names)
    if len(names) != k:
        raise SRError(f"names has {len(names)} entries but X has k = {k} columns")
    for s in names:
        if not s.isidentifier() or keyword.iskeyword(s):
            raise SRError(f"variable name {s!r} is not a valid identifier")
        if s in RESERVED_NAMES or s.startswith("_"):
            raise SRError(f"variable name {s!r} is reserved (a function, constant or module name that "
                          "formulas are printed with, or a leading underscore); rename the variable")
        if _sympy_binds(s):
            raise SRError(f"variable name {s!r} is reserved: sympy reads it as its own {s} (a function, "
                          "constant or object, not a plain symbol), so equations would print it as that; "
                          "rename the variable")
    if len(set(names)) != k:
        raise SRError(f"variable names must be distinct, got {names}")
    return names


def _sympy_binds(name: str) -> bool:
    """Whether sympy takes `name` as something other than a plain Symbol (gamma, beta, EulerGamma,
    Catalan, Q, N, ...): the equation text is sympy's, so such a variable would read as sympy's object."""
    import sympy

    if hasattr(sympy, name):
        return True
    try:
        return sympy.sympify(name) != sympy.Symbol(name)
    except Exception:           # anything sympy cannot read as a symbol is no plain symbol either
        return True


def lattice_step(y: np.ndarray) -> float | None:
    """The step q when every value of y is y0 + an integer multiple of q (a staircase, counts,
    indicators), else None. Rounded measurements are lattices too, with q far below their
    local variation; the caller tells the two apart."""
    u = np.unique(y)
    if len(u) < 2:
        return None
    d = np.diff(u)
    q = float(d.min())
    top = float(np.max(np.abs(u)))
    if not q > 1e-9 * top:
        return None
    r = (u - u[0]) / q
    if r[-1] > 1e6:
        return None
    return q if float(np.max(np.abs(r - np.round(r)))) <= 1e-6 else None


def neighbour_steps(X: np.ndarray, y: np.ndarray, q: float, rng: np.random.Generator,
                    n_query: int = 400) -> float:
    """Median |y_i - y_j| in lattice steps q, j the nearest neighbour of i in X (scaled per
    column). A staircase moves by 0, 1 or 2 steps between neighbours; smooth data rounded to a fine
    lattice (measurements to 4 decimals) by many."""
    n = len(X)
    scale = X.std(axis=0)
    scale[scale == 0] = 1.0
    Z = X / scale
    idx = rng.choice(n, size=min(n_query, n), replace=False)
    steps = []
    for chunk in np.array_split(idx, max(1, len(idx) // 100)):
        d2 = ((Z[chunk, None, :] - Z[None, :, :]) ** 2).sum(-1)
        d2[d2 == 0] = np.inf  # itself and exact repeats
        j = np.argmin(d2, axis=1)
        ok = np.isfinite(d2[np.arange(len(chunk)), j])
        steps.append(np.abs(y[chunk] - y[j])[ok] / q)
    s = np.concatenate(steps)
    return float(np.median(s)) if s.size else 0.0


def integer_valued(v: np.ndarray) -> bool:
    return bool(np.all(np.abs(v) < 2.0**31) and np.all(v == np.round(v)))


@dataclass
class Data:
    X: np.ndarray  # (n, k) all points
    y: np.ndarray  # (n,)
    names: tuple
    Xf: np.ndarray  # (M, k) fitting points
    yf: np.ndarray  # (M,)
    wf: np.ndarray  # (M,) weights (group counts), sum = W
    ssw: float  # within-group sum of squares of y: loss no formula of X can remove
    W: float
    screen: np.ndarray  # (m,) indices into the fitting points
    probes: np.ndarray  # (m + N_OFF, k)
    y_rms: float
    sigma: float  # noise std estimate (or from tol)
    sigma_method: str
    thr: float  # absolute rmse a formula must reach to pass
    binary: tuple  # indices of inputs whose values are all in {0, 1}
    warning: str = ""  # why no formula can be certified exact, when that is known up front
    ylo: np.ndarray | None = None  # (M,) smallest and largest y of the points behind each fit point
    yhi: np.ndarray | None = None
    integer: bool = False  # integer inputs and an integer-valued target: integer operators apply
    note: str = ""  # how the tolerance was decided, when the reader should know
    weighted: bool = False  # fitted with sample weights (wf holds them, summed per group)
    members: tuple | None = None  # weighted groups: (group of each point, its y, sqrt of its weight)

    @property
    def max_err_allowed(self) -> float:
        return MAX_ERR_FACTOR * self.thr

    @property
    def k(self) -> int:
        return self.X.shape[1]

    def cols(self, where: str = "fit") -> list[np.ndarray]:
        Z = {"fit": self.Xf, "screen": self.Xf[self.screen], "probe": self.probes, "all": self.X}[where]
        return [np.ascontiguousarray(Z[:, i]) for i in range(Z.shape[1])]

    def rmse(self, pred: np.ndarray) -> float:
        """Root mean squared error over all n points of a prediction at the fitting points."""
        r = self.yf - pred
        return float(np.sqrt((np.dot(self.wf * r, r) + self.ssw) / self.W))

    def max_err(self, pred: np.ndarray) -> float:
        """Largest |y_i - prediction| over the points behind the fitting points; under sample
        weights sqrt(w_i) |y_i - prediction|, the residual as the weighted loss sees it (a point
        of weight 1e-6 may miss by 1000 tolerances)."""
        with np.errstate(all="ignore"):
            if self.members is not None:
                inv, y, s = self.members
                e = s * np.abs(y - np.broadcast_to(pred, self.yf.shape)[inv])
            elif self.weighted:
                e = np.sqrt(self.wf) * np.abs(self.yf - pred)
            else:
                e = np.maximum(self.yhi - pred, pred - self.ylo)
        return float(np.max(e)) if np.all(np.isfinite(e)) else np.inf

    def passes(self, pred: np.ndarray, rmse: float | None = None) -> bool:
        """Within the tolerance: rms error at most thr and no point off by more than MAX_ERR_FACTOR thr."""
        r = self.rmse(pred) if rmse is None else rmse
        return bool(r <= self.thr and self.max_err(pred) <= self.max_err_allowed)


def prepare(X: np.ndarray, y: np.ndarray, names: tuple, tol: float | None,
            rng: np.random.Generator, weights: np.ndarray | None = None) -> Data:
    """The search's views of (X, y). ``weights`` (n,), positive with mean 1 (see check_weights),
    scale each point's share of every loss; None: all points alike."""
    n, k = X.shape
    uniq, inv, counts = group_rows(X)
    w = np.ones(n) if weights is None else weights
    if len(uniq) <= 0.5 * n:  # repeated inputs: fit the group means with weights (exact, fast)
        Xf = uniq
        wf = counts.astype(np.float64) if weights is None else np.bincount(inv, weights=w)
        yf = np.bincount(inv, weights=y if weights is None else w * y) / wf
        ssw = float(np.sum(w * (y - yf[inv]) ** 2))
        members = None if weights is None else (inv, y, np.sqrt(w))
        ylo = np.full(len(uniq), np.inf)
        yhi = np.full(len(uniq), -np.inf)
        np.minimum.at(ylo, inv, y)
        np.maximum.at(yhi, inv, y)
    else:
        idx = rng.choice(n, MAX_FIT_POINTS, replace=False) if n > MAX_FIT_POINTS else np.arange(n)
        Xf, yf, wf, ssw = X[idx], y[idx], w[idx].astype(np.float64), 0.0
        members = None
        ylo = yhi = yf
    M = len(Xf)
    screen = np.sort(rng.choice(M, N_SCREEN, replace=False)) if M > N_SCREEN else np.arange(M)
    # make sure the screen sees each input's extremes (kinks and ranges matter for dedup)
    extremes = np.unique(np.concatenate([[np.argmin(Xf[:, i]), np.argmax(Xf[:, i])] for i in range(k)]))
    screen = np.union1d(screen, extremes)
    probes = np.vstack([Xf[screen], off_distribution_points(X, N_OFF, rng)])
    y_rms = float(np.sqrt(np.mean(y**2) if weights is None else np.average(y**2, weights=w)))
    note = ""
    if tol is not None:
        tol = check_tol(tol)
        sigma, method = tol * y_rms / TOL_FACTOR, "tol"
    else:
        sample = slice(None) if weights is None else weighted_sample(weights, rng)
        Xs, ys = X[sample], y[sample]
        est = estimate_sigma(Xs, ys, rng)
        sigma, method = est["sigma"], est["method"]
        q = lattice_step(ys) if method == "local-quadratic" and sigma > 0 else None
        if q is not None and sigma >= QUANTISED_SIGMA * q and neighbour_steps(Xs, ys, q, rng) <= STAIRCASE_STEPS:
            # the local "noise" is the lattice's own steps (floor(x/3) on integers reads as noise
            # of std ~0.4 to a local quadratic): continuous noise would not leave y on a lattice,
            # so the data are taken as exact and a formula must match every point
            note = (f"y lies on a lattice of step {q:.6g} and varies by whole steps between neighbours: "
                    "treated as exact data (no noise); pass tol to allow an error")
            sigma, method = 0.0, "lattice"
    # the exactness floor follows y's spread, not its size (y = u + 1e9 would let a constant that
    # ignores u through at 1e-9 of rms(y)), and never goes below float64's resolution of y
    y_spread = float(np.std(y) if weights is None
                     else np.sqrt(np.average((y - np.average(y, weights=w)) ** 2, weights=w)))
    thr = TOL_FACTOR * sigma + max(REL_FLOOR * y_spread, 64 * np.finfo(np.float64).eps * float(np.abs(y).max()),
                                   REL_FLOOR * 1e-300 if y_rms == 0 else 0.0, 1e-300)
    binary = tuple(i for i in range(k) if np.all((X[:, i] == 0) | (X[:, i] == 1)))
    warning = ""
    if tol is None and sigma > MAX_REL_NOISE * y_rms:
        warning = (f"the estimated noise ({sigma:.3g}) is {100 * sigma / y_rms:.0f}% of rms(y): y looks "
                   "like noise, so no formula is certified (pass tol to decide yourself)")
    # integer operators apply on integer inputs when y is integer-valued (within the tolerance
    # when one is given) or on a lattice (0.5 * (x // 3) + 0.25)
    integer = integer_valued(X) and (
        integer_valued(yf) or (method != "tol" and lattice_step(yf) is not None)
        or float(np.sqrt(np.dot(wf, (yf - np.round(yf)) ** 2) / wf.sum())) <= thr)
    return Data(X, y, names, Xf, yf, wf, ssw, float(wf.sum()), screen, probes, y_rms,
                float(sigma), method, float(thr), binary, warning, ylo, yhi, integer, note, weights is not None,
                members)


def weighted_sample(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of the points the noise estimate (and the residual-structure test) look at
    under sample weights: about as many distinct points as the weights effectively keep (Kish's
    (sum w)^2 / sum w^2), point i taken with probability min(1, c w_i). Down-weighted points (a
    contaminated half at weight 1e-6) then barely enter the noise level, as they barely enter the
    loss; distinct points keep the replicate estimator from reading a row drawn twice as a
    noise-free repeat."""
    n_eff = float(weights.sum() ** 2 / np.sum(weights**2))
    m = min(float(len(weights)), max(n_eff, float(MIN_POINTS)))
    lo, hi = 0.0, 1.0 / float(weights[weights > 0].min())      # sum min(1, c w) is m somewhere in [lo, hi]
    for _ in range(60):
        c = 0.5 * (lo + hi)
        lo, hi = (c, hi) if np.minimum(1.0, c * weights).sum() < m else (lo, c)
    idx = np.flatnonzero(rng.random(len(weights)) < np.minimum(1.0, hi * weights))
    if len(idx) < MIN_POINTS:       # a tiny n_eff: the heaviest points
        idx = np.sort(np.argsort(-weights, kind="stable")[:MIN_POINTS])
    return idx


def check_weights(sample_weight, n: int) -> np.ndarray:
    """sample_weight as (n,) float64 weights; a scalar weighs all points alike. Negative,
    non-finite or all-zero weights are refused, naming the first bad row."""
    if hasattr(sample_weight, "tocsr") or hasattr(sample_weight, "todense"):
        raise SRError("sample_weight is a sparse matrix: pass a dense 1-D array of n weights")
    sample_weight = plain_numbers(sample_weight, "sample_weight", SRError)
    try:
        w = np.asarray(sample_weight)
        if w.dtype.kind == "c":
            raise SRError("sample_weight is complex: weights are non-negative real numbers")
        w = w.astype(np.float64)
    except (TypeError, ValueError) as e:
        if isinstance(e, SRError):
            raise
        raise SRError(f"sample_weight must be numbers: {e}") from None
    if w.ndim == 0:
        w = np.full(n, float(w))
    if w.shape != (n,):
        raise SRError(f"sample_weight must have shape ({n},), one weight per row of X, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise SRError(f"sample_weight contains non-finite values (NaN/inf), first at row {int(np.flatnonzero(~np.isfinite(w))[0])}")
    if np.any(w < 0):
        raise SRError(f"sample_weight must be non-negative, got {w[w < 0][0]:.6g} at row {int(np.flatnonzero(w < 0)[0])}")
    if not np.any(w > 0):
        raise SRError("sample_weight is zero everywhere: at least some points must count")
    return w


def weighted_points(X: np.ndarray, y: np.ndarray, w: np.ndarray):
    """(X, y, weights) for prepare: the points of weight 0 left out (they take no part in any
    loss, so the fit is the one without them, exactly), the others' weights scaled to mean 1 so
    that losses stay mean squared errors; weights None when every kept point weighs the same
    (the fit is then exactly the unweighted one)."""
    keep = w > 0
    if keep.sum() < MIN_POINTS:
        raise SRError(f"too few points of positive sample_weight: {int(keep.sum())}, need at least {MIN_POINTS}")
    X, y, w = X[keep], y[keep], w[keep]
    if np.all(w == w[0]):
        return X, y, None
    return X, y, w / w.mean()


def check_tol(tol) -> float:
    if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, (int, float, np.integer, np.floating)):
        raise SRError(f"tol must be None or a non-negative finite number (relative rms error), got {tol!r}")
    if not (np.isfinite(tol) and tol >= 0):
        raise SRError(f"tol must be a non-negative finite number (relative rms error), got {tol!r}")
    return float(tol)
