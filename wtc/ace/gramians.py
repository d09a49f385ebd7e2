"""Streaming float64 Gramians of a layer: activation covariance and Jacobian observability.

Cov = Hc^T Hc / (N - 1) (H centred) and Obs = mean_i J_i^T J_i, accumulated chunk by chunk so N
never has to fit in memory: the running mean, the centred scatter M2 = sum (h - mean)(h - mean)^T
and sum J^T J are kept (D, D each), nothing N x D.

Each chunk is centred on its own mean and merged with Chan's update
    M2 <- M2 + S_b + (n_a n_b / n) d d^T,   mean <- mean + d n_b / n,   d = mean_b - mean_a,
rather than accumulating sum h h^T and subtracting N mean mean^T at the end, which cancels
catastrophically when the mean is large next to the spread (|mean| / std = 1e3 loses ~6 digits).

Two backends, the same math: wtc._C.gramian_update (native: blocked symmetric rank-k update in
float64, float32 chunks widened per block of rows, OpenMP) and torch float64 (the reference;
backend="reference", or chunks on a GPU); backend=None leaves it to wtc.backend.choose
("ace.gramian": native when built, WTC_KERNELS overrides). The native one writes the upper
triangles only; the matrices are mirrored when read.
"""
from __future__ import annotations

import numpy as np
import torch

from wtc import _native
from wtc.backend import choose, require_native
from wtc.errors import AceError, BackendNameError

BACKENDS = ("native", "reference")


def _symmetric(upper: torch.Tensor) -> torch.Tensor:
    """The symmetric matrix whose upper triangle (diagonal included) is that of `upper`."""
    return torch.triu(upper) + torch.triu(upper, 1).T


def _numpy_view(x) -> np.ndarray:
    """A CPU float32/float64 numpy view of a chunk (no copy when it already is one)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        return x.numpy()
    x = np.asarray(x)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def _on_cpu(x) -> bool:
    return not isinstance(x, torch.Tensor) or x.device.type == "cpu"


class GramianAccumulator:
    """Running float64 mean, centred scatter and sum J^T J of chunks (h (n, D), J (n, K, D)).

    backend: None (wtc.backend.choose: native when wtc._C is built and WTC_KERNELS is not
    'reference'), 'native' (BackendError when not built) or 'reference' (torch float64). Chunks on
    a GPU always go through torch on their device; the state stays on the CPU.
    """

    def __init__(self, dim: int, backend: str | None = None):
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise AceError(f"dim must be a positive int, got {dim!r}")
        if backend is not None and backend not in BACKENDS:
            raise BackendNameError(f"backend must be one of {', '.join(BACKENDS)} or None, got {backend!r}")
        if backend == "native":
            require_native("backend='native'")
        self.dim = dim
        self.backend = backend or choose("ace.gramian", "cpu")     # the state lives on the CPU
        self.n = 0
        self._mean = torch.zeros(dim, dtype=torch.float64)
        self._m2 = torch.zeros(dim, dim, dtype=torch.float64)      # upper triangle authoritative
        self._jj = torch.zeros(dim, dim, dtype=torch.float64)      # upper triangle authoritative

    def add(self, h, J) -> None:
        """h (n, D) activations; J (n, K, D) Jacobians of the readout at those activations.
        torch tensors or numpy arrays, any float dtype (float32/float64 go to the native kernel
        as they are). A chunk holding NaN/inf raises ValueError and leaves the state unchanged."""
        if h.ndim != 2 or h.shape[1] != self.dim:
            raise AceError(f"activations must be (n, {self.dim}), got {tuple(h.shape)}")
        if J.ndim != 3 or J.shape[0] != h.shape[0] or J.shape[2] != self.dim:
            raise AceError(f"Jacobians must be (n, K, {self.dim}) with n = {h.shape[0]}, got {tuple(J.shape)}")
        if J.shape[1] < 1:
            raise AceError(f"Jacobians must have K >= 1 readout outputs, got {tuple(J.shape)}")
        for what, a in (("activations", h), ("Jacobians", J)):
            if np.iscomplexobj(a) if not isinstance(a, torch.Tensor) else a.dtype.is_complex:
                raise AceError(f"{what} are complex ({a.dtype}); the Gramians are of real activations")
        if h.shape[0] == 0:
            return
        if self.backend == "native" and _on_cpu(h) and _on_cpu(J):
            try:
                self._add_native(h, J)
            except AceError:
                raise
            except ValueError as exc:          # the kernel's NaN/inf check (the state is unchanged)
                raise AceError(str(exc)) from None
        else:
            self._add_reference(h, J)

    def _add_native(self, h, J) -> None:
        self.n = _native.cpu_module().gramian_update(
            _numpy_view(h), _numpy_view(J), self._mean.numpy(), self._m2.numpy(), self._jj.numpy(), self.n)

    def _add_reference(self, h, J) -> None:
        h = torch.as_tensor(h).detach()
        J = torch.as_tensor(J).detach()
        if not (torch.isfinite(h).all() and torch.isfinite(J).all()):
            raise AceError("activations or Jacobians hold NaN/inf")
        h64, J64 = h.to(torch.float64), J.to(torch.float64).reshape(-1, self.dim)
        n_b = h64.shape[0]
        mean_b = h64.mean(0)
        hc = h64.sub_(mean_b) if h64.data_ptr() != h.data_ptr() else h64 - mean_b   # never centre the caller's tensor
        n_a, n = self.n, self.n + n_b
        if hc.device.type == "cpu":
            self._m2.addmm_(hc.T, hc)
            self._jj.addmm_(J64.T, J64)
        else:
            self._m2 += (hc.T @ hc).cpu()
            self._jj += (J64.T @ J64).cpu()
        mean_b = mean_b.cpu()
        if n_a > 0:
            delta = mean_b - self._mean
            self._m2.addr_(delta, delta, alpha=n_a * n_b / n)
            self._mean.add_(delta, alpha=n_b / n)
        else:
            self._mean.copy_(mean_b)
        self.n = n

    @property
    def mean(self) -> torch.Tensor:
        """(D,) mean of the activations so far (a copy)."""
        return self._mean.clone()

    @property
    def scatter(self) -> torch.Tensor:
        """(D, D) centred scatter sum (h - mean)(h - mean)^T."""
        return _symmetric(self._m2)

    @property
    def sum_h(self) -> torch.Tensor:
        return self._mean * self.n

    @property
    def sum_hh(self) -> torch.Tensor:
        """(D, D) raw sum h h^T (derived: scatter + n mean mean^T)."""
        return self.scatter + self.n * torch.outer(self._mean, self._mean)

    @property
    def sum_jj(self) -> torch.Tensor:
        """(D, D) sum over samples of J_i^T J_i."""
        return _symmetric(self._jj)

    def covariance(self) -> torch.Tensor:
        if self.n < 2:
            raise AceError(f"covariance needs at least 2 samples, got {self.n}")
        return self.scatter / (self.n - 1)

    def observability(self) -> torch.Tensor:
        if self.n < 1:
            raise AceError("observability needs at least 1 sample")
        return self.sum_jj / self.n
