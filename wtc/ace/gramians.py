"""Streaming float64 Gramians of a layer: activation covariance and Jacobian observability.

Cov = Hc^T Hc / (N - 1) (H centred) and Obs = mean_i J_i^T J_i, accumulated chunk by chunk so N
never has to fit in memory: sums of h, of h h^T and of J^T J are kept (D x D each), nothing N x D.
"""
from __future__ import annotations

import torch


class GramianAccumulator:
    def __init__(self, dim: int):
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        self.dim = dim
        self.n = 0
        self.sum_h = torch.zeros(dim, dtype=torch.float64)
        self.sum_hh = torch.zeros(dim, dim, dtype=torch.float64)
        self.sum_jj = torch.zeros(dim, dim, dtype=torch.float64)

    def add(self, h: torch.Tensor, J: torch.Tensor) -> None:
        """h (n, D) activations; J (n, K, D) Jacobians of the readout at those activations."""
        if h.ndim != 2 or h.shape[1] != self.dim:
            raise ValueError(f"activations must be (n, {self.dim}), got {tuple(h.shape)}")
        if J.ndim != 3 or J.shape[0] != h.shape[0] or J.shape[2] != self.dim:
            raise ValueError(f"Jacobians must be (n, K, {self.dim}) with n = {h.shape[0]}, got {tuple(J.shape)}")
        if not (torch.isfinite(h).all() and torch.isfinite(J).all()):
            raise ValueError("activations or Jacobians hold NaN/inf")
        h64, J64 = h.detach().double(), J.detach().double().reshape(-1, self.dim)
        self.n += h.shape[0]
        self.sum_h += h64.sum(0)
        self.sum_hh += h64.T @ h64
        self.sum_jj += J64.T @ J64

    @property
    def mean(self) -> torch.Tensor:
        return self.sum_h / max(self.n, 1)

    def covariance(self) -> torch.Tensor:
        if self.n < 2:
            raise ValueError(f"covariance needs at least 2 samples, got {self.n}")
        mu = self.mean
        return (self.sum_hh - self.n * torch.outer(mu, mu)) / (self.n - 1)

    def observability(self) -> torch.Tensor:
        if self.n < 1:
            raise ValueError("observability needs at least 1 sample")
        return self.sum_jj / self.n
