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

MAX_INPUTS = 3  # the builtin enumeration is sized for the sub-MLPs of a Discrete Transformer
MIN_POINTS = 8
MAX_FIT_POINTS = 20_000
N_SCREEN = 128
N_OFF = 24
TOL_FACTOR = 1.3  # a formula passes when its rmse <= TOL_FACTOR * noise estimate (+ floor)
REL_FLOOR = 1e-9  # noise-free data: rmse below REL_FLOOR * rms(y) counts as exact
MAX_REL_NOISE = 0.1  # estimated noise above this fraction of rms(y): nothing can be certified


def check_inputs(X, y, names=None, max_inputs: int = MAX_INPUTS) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Validate and normalise (X (n, k), y (n,), names); raise SRError naming the problem."""
    for what, v in (("X", X), ("y", y)):
        try:
            if np.iscomplexobj(v):
                raise SRError(f"{what} is complex; symbolic regression fits real numbers")
        except (TypeError, ValueError) as e:   # ragged nested lists
            if isinstance(e, SRError):
                raise
            raise SRError(f"{what} must be a numeric array: {e}") from None
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise SRError(f"X must be a numeric array of shape (n, k): {e}") from None
    try:
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as e:
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
        raise SRError("X has no input columns (k = 0)")
    if k > max_inputs:
        raise SRError(f"at most {max_inputs} inputs are supported here, X has k = {k}"
                         + (" (backend='pysr' takes more)" if max_inputs == MAX_INPUTS else ""))
    if n < MIN_POINTS:
        raise SRError(f"too few points: got n = {n}, need at least {MIN_POINTS}")
    bad_x = ~np.isfinite(X)
    if bad_x.any():
        r, c = np.argwhere(bad_x)[0]
        raise SRError(f"X contains {int(bad_x.sum())} non-finite values (NaN/inf), first at row {r}, column {c}")
    bad_y = ~np.isfinite(y)
    if bad_y.any():
        raise SRError(f"y contains {int(bad_y.sum())} non-finite values (NaN/inf), first at row "
                         f"{int(np.flatnonzero(bad_y)[0])}")
    if names is None:
        names = tuple(f"x{i}" for i in range(k)) if k > 1 else ("x",)
    names = tuple(str(s) for s in names)
    if len(names) != k:
        raise SRError(f"names has {len(names)} entries but X has k = {k} columns")
    for s in names:
        if not s.isidentifier() or keyword.iskeyword(s):
            raise SRError(f"variable name {s!r} is not a valid identifier")
    if len(set(names)) != k:
        raise SRError(f"variable names must be distinct, got {names}")
    return X, y, names


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


def prepare(X: np.ndarray, y: np.ndarray, names: tuple, tol: float | None,
            rng: np.random.Generator) -> Data:
    n, k = X.shape
    uniq, inv, counts = group_rows(X)
    if len(uniq) <= 0.5 * n:  # repeated inputs: fit the group means with weights (exact, fast)
        Xf = uniq
        wf = counts.astype(np.float64)
        yf = np.bincount(inv, weights=y) / counts
        ssw = float(np.sum((y - yf[inv]) ** 2))
    else:
        idx = rng.choice(n, MAX_FIT_POINTS, replace=False) if n > MAX_FIT_POINTS else np.arange(n)
        Xf, yf, wf, ssw = X[idx], y[idx], np.ones(len(idx)), 0.0
    M = len(Xf)
    screen = np.sort(rng.choice(M, N_SCREEN, replace=False)) if M > N_SCREEN else np.arange(M)
    # make sure the screen sees each input's extremes (kinks and ranges matter for dedup)
    extremes = np.unique(np.concatenate([[np.argmin(Xf[:, i]), np.argmax(Xf[:, i])] for i in range(k)]))
    screen = np.union1d(screen, extremes)
    probes = np.vstack([Xf[screen], off_distribution_points(X, N_OFF, rng)])
    y_rms = float(np.sqrt(np.mean(y**2)))
    if tol is not None:
        if not (np.isfinite(tol) and tol >= 0):
            raise SRError(f"tol must be a non-negative finite number (relative rms error), got {tol!r}")
        sigma, method = tol * y_rms / TOL_FACTOR, "tol"
    else:
        est = estimate_sigma(X, y, rng)
        sigma, method = est["sigma"], est["method"]
    thr = TOL_FACTOR * sigma + REL_FLOOR * max(y_rms, 1e-300)
    binary = tuple(i for i in range(k) if np.all((X[:, i] == 0) | (X[:, i] == 1)))
    warning = ""
    if tol is None and sigma > MAX_REL_NOISE * y_rms:
        warning = (f"the estimated noise ({sigma:.3g}) is {100 * sigma / y_rms:.0f}% of rms(y): y looks "
                   "like noise, so no formula is certified (pass tol to decide yourself)")
    return Data(X, y, names, Xf, yf, wf, ssw, float(wf.sum()), screen, probes, y_rms,
                float(sigma), method, float(thr), binary, warning)
