"""Balanced SVD of a layer: the directions that are both active (Cov) and output-relevant (Obs).

Factor Cov = Lc Lc^T and Obs = Lo Lo^T (eigh, small jitter), U, s = svd(Lc^T Lo); the rank-r core
is orth(Lc U[:, :r]) with weights s^2. With Lc = Hc^T / sqrt(N - 1) and Lo = J^T / sqrt(N) this is
the SVD of Hc J^T (samples stacked); any other factor gives the same subspace and singular values.
"""
from __future__ import annotations

import torch


def psd_factor(A: torch.Tensor, jitter: float = 1e-12) -> torch.Tensor:
    """L with L L^T = A (symmetric PSD), from eigh; eigenvalues below jitter * max are dropped."""
    A = 0.5 * (A + A.T)
    w, V = torch.linalg.eigh(A.double())
    keep = w > jitter * max(float(w.max()), 0.0)
    return V[:, keep] * w[keep].sqrt()


def balanced_svd(cov: torch.Tensor, obs: torch.Tensor, jitter: float = 1e-12):
    """(basis (D, m) orthonormal, ordered by s; s (m,)), m = number of nonzero singular values."""
    if cov.shape != obs.shape or cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise ValueError(f"cov and obs must be square and of equal shape, got {tuple(cov.shape)}, {tuple(obs.shape)}")
    Lc, Lo = psd_factor(cov, jitter), psd_factor(obs, jitter)
    U, s, _ = torch.linalg.svd(Lc.T @ Lo, full_matrices=False)
    keep = s > jitter ** 0.5 * max(float(s.max()), 0.0) if s.numel() else s > 0
    U, s = U[:, keep], s[keep]
    return orth_prefixes(Lc @ U), s


def orth_prefixes(X: torch.Tensor) -> torch.Tensor:
    """Q with span(Q[:, :r]) = span(X[:, :r]) for every r (QR keeps the order of the columns)."""
    Q, R = torch.linalg.qr(X)
    return Q * torch.sign(torch.diagonal(R)).where(torch.diagonal(R) != 0, torch.ones(()))


def rank_for_energy(s: torch.Tensor, energy: float) -> int:
    """Smallest r whose s^2 share reaches `energy`."""
    if not 0 < energy <= 1:
        raise ValueError(f"energy must be in (0, 1], got {energy}")
    w = s.double() ** 2
    if w.sum() <= 0:
        return 0
    frac = torch.cumsum(w, 0) / w.sum()
    return int((frac < energy - 1e-12).sum()) + 1
