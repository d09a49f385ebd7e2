"""Balanced SVD of a layer: the directions that are both active (Cov) and output-relevant (Obs).

Factor Cov = Lc Lc^T and Obs = Lo Lo^T (eigh, small jitter), U, s = svd(Lc^T Lo); the rank-r core
is orth(Lc U[:, :r]) with weights s^2. With Lc = Hc^T / sqrt(N - 1) and Lo = J^T / sqrt(N) this is
the SVD of Hc J^T (samples stacked); any other factor gives the same subspace and singular values
(the columns of Lc U are the eigenvectors of Cov Obs, with eigenvalues s^2).

method="randomized" (large D, only the top `rank` wanted) needs no factorisation at all: the
columns of Lc U being the eigenvectors of Cov Obs, a randomized range finder with power iterations
on Cov Obs (= Lc (Lc^T Lo) Lo^T: the range of Lc^T Lo carried through Lc) applied only as products
with D x (rank + oversample) blocks finds their span; a Rayleigh-Ritz step on the symmetric pencil
(Q^T Obs Cov Obs Q, Q^T Obs Q) gives s^2, and one more product with Cov Obs maps each Ritz vector
onto the exact eigenvector (null(Obs) components drop out). Cost O(D^2 (rank + oversample)) per
power iteration instead of two D^3 eigh and a D x D SVD; no D x D matrix is formed.
"""
from __future__ import annotations

import math

import torch

from wtc.errors import AceError

METHODS = ("exact", "randomized")


def psd_factor(A: torch.Tensor, jitter: float = 1e-12) -> torch.Tensor:
    """L with L L^T = A (symmetric PSD), from eigh; eigenvalues below jitter * max are dropped."""
    A = 0.5 * (A + A.T)
    w, V = torch.linalg.eigh(A.double())
    if w.numel() and float(w.min()) < -1e-4 * float(w.abs().max()):
        raise AceError(f"a Gramian (cov or obs) has the eigenvalue {float(w.min()):.3g} (largest "
                       f"{float(w.abs().max()):.3g}): it is not positive semidefinite")
    keep = w > jitter * max(float(w.max()), 0.0)
    return V[:, keep] * w[keep].sqrt()


def _check_pair(cov: torch.Tensor, obs: torch.Tensor, jitter: float = 0.0) -> None:
    if not torch.is_tensor(cov) or not torch.is_tensor(obs):
        raise AceError(f"cov and obs must be torch tensors, got {type(cov).__name__} and {type(obs).__name__}")
    if cov.shape != obs.shape or cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise AceError(f"cov and obs must be square and of equal shape, got {tuple(cov.shape)}, {tuple(obs.shape)}")
    if cov.shape[0] == 0:
        raise AceError("cov and obs are empty (0 x 0): a Gramian needs at least one dimension")
    if cov.dtype.is_complex or obs.dtype.is_complex:
        raise AceError(f"cov and obs must be real Gramians, got {cov.dtype} and {obs.dtype}")
    if not (torch.isfinite(cov).all() and torch.isfinite(obs).all()):
        raise AceError("cov or obs hold NaN/inf")
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not math.isfinite(jitter) or jitter < 0:
        raise AceError(f"jitter must be a finite number >= 0, got {jitter!r}")
    for name, A in (("cov", cov), ("obs", obs)):     # Gramians: symmetric (positive semidefinite: psd_factor)
        A = A.double()
        scale = float(A.abs().max())
        if scale > 0 and float((A - A.T).abs().max()) > 1e-6 * scale:
            raise AceError(f"{name} is not symmetric (|A - A^T| up to {float((A - A.T).abs().max()):.3g}); it must "
                           "be a Gramian (a covariance, or J^T J)")


def balanced_svd(cov: torch.Tensor, obs: torch.Tensor, jitter: float = 1e-12, *, rank: int | None = None,
                 method: str = "exact", oversample: int = 10, power_iters: int = 2, seed: int = 0):
    """(basis (D, m) orthonormal, ordered by s; s (m,)).

    exact: m = number of nonzero singular values (at most `rank` when given). randomized: the top
    `rank` (required) from a sketch of rank + oversample columns refined by power_iters power
    iterations (seeded: the same inputs give the same result); singular values below
    sqrt(jitter) * s_max are dropped as in the exact method, so m <= rank."""
    _check_pair(cov, obs, jitter)
    if method not in METHODS:
        raise AceError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if rank is not None and (not isinstance(rank, int) or rank < 0):
        raise AceError(f"rank must be a non-negative int, got {rank!r}")
    if method == "randomized":
        if rank is None:
            raise AceError("method='randomized' needs rank=r (the number of top directions wanted)")
        return _balanced_svd_randomized(cov, obs, jitter, rank, oversample, power_iters, seed)
    Lc, Lo = psd_factor(cov, jitter), psd_factor(obs, jitter)
    U, s, _ = torch.linalg.svd(Lc.T @ Lo, full_matrices=False)
    keep = s > jitter ** 0.5 * max(float(s.max()), 0.0) if s.numel() else s > 0
    U, s = U[:, keep], s[keep]
    if rank is not None:
        U, s = U[:, :rank], s[:rank]
    return orth_prefixes(Lc @ U), s


def balanced_truncation(cov: torch.Tensor, obs: torch.Tensor, jitter: float = 1e-12):
    """(T (D, m), W (D, m), s (m,)): the balancing pair of the exact method. Columns of T span the
    same prefixes as balanced_svd's basis; W^T T = I; the rank-r oblique projector T_r W_r^T keeps
    the core's directions and annihilates what is unobservable (null(Obs)) and the other balanced
    directions, where the orthogonal projector Q_r Q_r^T would let a high-variance decoy that is
    not orthogonal to the core leak through. T = Lc U S^-1/2, W = Lo V S^-1/2 for Lc^T Lo = U S V^T."""
    _check_pair(cov, obs)
    Lc, Lo = psd_factor(cov, jitter), psd_factor(obs, jitter)
    U, s, Vh = torch.linalg.svd(Lc.T @ Lo, full_matrices=False)
    keep = s > jitter ** 0.5 * max(float(s.max()), 0.0) if s.numel() else s > 0
    U, s, V = U[:, keep], s[keep], Vh.T[:, keep]
    scale = s.rsqrt()
    return Lc @ U * scale, Lo @ V * scale, s


def _balanced_svd_randomized(cov, obs, jitter, rank, oversample, power_iters, seed):
    if not isinstance(oversample, int) or oversample < 0:
        raise AceError(f"oversample must be a non-negative int, got {oversample!r}")
    if not isinstance(power_iters, int) or power_iters < 0:
        raise AceError(f"power_iters must be a non-negative int, got {power_iters!r}")
    cov, obs = cov.double(), obs.double()            # used as given: symmetric, as the accumulator returns them
    D = cov.shape[0]
    width = min(D, rank + oversample)
    gen = torch.Generator().manual_seed(seed)
    Y = cov @ (obs @ torch.randn(D, width, generator=gen, dtype=torch.float64))
    for _ in range(power_iters):                     # re-orthonormalised subspace iteration on Cov Obs
        Y = cov @ (obs @ torch.linalg.qr(Y).Q)
    Q = torch.linalg.qr(Y).Q
    OQ = obs @ Q
    COQ = cov @ OQ
    # Rayleigh-Ritz on Obs Cov Obs x = s^2 Obs x within span(Q), on the part where Q^T Obs Q > 0
    beta, V = torch.linalg.eigh(_sym(Q.T @ OQ))
    if beta.numel() == 0 or float(beta.max()) <= 0:
        return torch.zeros(D, 0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    keep = beta > jitter * float(beta.max())
    Wb = V[:, keep] / beta[keep].sqrt()
    lam, Z = torch.linalg.eigh(_sym(Wb.T @ (OQ.T @ COQ) @ Wb))
    lam, Z = lam.flip(0), Z.flip(1)                  # descending
    s = lam.clamp(min=0).sqrt()
    X = COQ @ (Wb @ Z)                               # Cov Obs (Q a): the eigenvector itself, times s^2
    keep = s > jitter ** 0.5 * max(float(s.max()), 0.0) if s.numel() else s > 0
    keep[rank:] = False
    return orth_prefixes(X[:, keep]), s[keep]


def _sym(A: torch.Tensor) -> torch.Tensor:
    return 0.5 * (A + A.T)


def balanced_energy(cov: torch.Tensor, obs: torch.Tensor) -> float:
    """sum of all s^2 = trace(Cov Obs), without any factorisation: the denominator of the energy
    fraction when only the top of the spectrum was computed (method='randomized')."""
    _check_pair(cov, obs)
    return float((cov.double() * obs.double().T).sum())


def orth_prefixes(X: torch.Tensor) -> torch.Tensor:
    """Q with span(Q[:, :r]) = span(X[:, :r]) for every r (QR keeps the order of the columns)."""
    Q, R = torch.linalg.qr(X)
    return Q * torch.sign(torch.diagonal(R)).where(torch.diagonal(R) != 0, torch.ones(()))


def rank_for_energy(s: torch.Tensor, energy: float, total: float | None = None) -> int:
    """Smallest r whose s^2 share reaches `energy`; `total` (default sum s^2) is the whole energy,
    e.g. balanced_energy(cov, obs) when s holds only the top of the spectrum. When s cannot reach
    the share of that total, len(s) is returned."""
    if not 0 < energy <= 1:
        raise AceError(f"energy must be in (0, 1], got {energy}")
    if not torch.is_tensor(s) or s.ndim != 1 or not torch.isfinite(s).all() or bool((s < 0).any()):
        raise AceError(f"s must be a 1-D tensor of singular values (finite, >= 0), got {s!r:.80}")
    w = s.double() ** 2
    denom = float(w.sum()) if total is None else float(total)
    if total is not None and not denom >= float(w.sum()) * (1 - 1e-9):
        raise AceError(f"total ({total!r}) is less than the energy in s ({float(w.sum()):.6g}); it is the whole "
                       "energy s is a part of")
    if denom <= 0 or w.numel() == 0:
        return 0
    frac = torch.cumsum(w, 0) / denom
    return min(int((frac < energy - 1e-12).sum()) + 1, w.numel())
