"""KL(clean || ablated) per position: torch reference, wtc._C and Triton, as wtc.backend chooses.

Three primitives of the per-weight scan, each with a readable torch path (the oracle) next to the
native CPU kernel (float32 inputs; float64 ones keep their precision in the torch path); on CUDA
tensors the two row-wise KLs run as Triton kernels (wtc.kernels.kl):
  kl_rows            clean log-probs (N, V) + ablated logits (A, N, V) -> (A, N) float64
  kl_unembed         closed form for zeroing W_U weights, all (v, j) at once, no ablated logits
  importance_positions  smallest position set holding `mass` of a weight's total KL
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from wtc import _native
from wtc.errors import ScanError
from wtc.backend import choose


class _Native:
    """wtc._C's scan kernels, their ValueErrors (NaN/inf in, shapes) as ScanErrors naming the same."""

    def __getattr__(self, name):
        fn = getattr(_native.cpu_module(), name)

        def call(*args):
            try:
                return fn(*args)
            except ValueError as exc:
                raise ScanError(f"{name}: {exc}") from None
        return call


def _cpu() -> _Native:
    return _Native()


def _check_finite(t: torch.Tensor, name: str) -> None:
    if not torch.isfinite(t).all():
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ScanError(f"{name} holds a non-finite value at index {tuple(bad)}")


def kl_rows_reference(logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """float64 KL(p || softmax(logits)) per row; logp (N, V), logits (A, N, V) -> (A, N)."""
    lp = logp.double()
    lq = torch.log_softmax(logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def kl_rows(logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per-position KL of each ablation against the clean distribution, float64 (A, N).

    Pass logp in float64 (log_softmax of the clean logits in double): a small KL is the difference
    of O(1) sums, so clean log-probs rounded to float32 leave ~1e-7 of noise at every position."""
    if logp.ndim != 2 or logits.ndim != 3 or logits.shape[1:] != logp.shape:
        raise ScanError(f"kl_rows: logp must be (N, V) and logits (A, N, V); got {tuple(logp.shape)} "
                         f"and {tuple(logits.shape)}")
    backend = choose("scan.kl_rows", logits)
    if backend == "triton":
        from wtc.kernels.kl import kl_rows as triton_kl_rows
        return triton_kl_rows(logp, logits)
    if backend == "native":
        out = _cpu().kl_rows(logp.detach().double().contiguous().numpy(),
                                           logits.detach().contiguous().numpy())
        return torch.from_numpy(out)
    _check_finite(logp, "logp")
    _check_finite(logits, "logits")
    return kl_rows_reference(logp, logits)


def kl_rank1(logp: torch.Tensor, logits: torch.Tensor, delta: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """KL against logits + delta[a, n] * direction[a, :] (a rank-1 ablation) -> (A, N) float64.
    logp (N, V) (float64, as for kl_rows), logits (N, V); delta (A, N); direction (A, V).
    Native: never forms the (A, N, V) logits."""
    backend = choose("scan.kl_rank1", logits, dtype=(logits.dtype, delta.dtype, direction.dtype))
    if backend == "triton":
        from wtc.kernels.kl import kl_rank1 as triton_kl_rank1
        return triton_kl_rank1(logp, logits, delta, direction)
    if backend == "native":
        out = _cpu().kl_rank1(logp.detach().double().contiguous().numpy(),
                                            *(t.detach().contiguous().numpy() for t in (logits, delta, direction)))
        return torch.from_numpy(out)
    return kl_rows(logp, logits[None] + delta[:, :, None] * direction[:, None, :])


def kl_unembed_reference(logp: torch.Tensor, h: torch.Tensor, W: torch.Tensor, v: torch.Tensor,
                         j: torch.Tensor) -> torch.Tensor:
    """Closed form, float64, per position: (M, N) for the pairs (v[m], j[m]).
    logp (N, V), h (N, D), W (V, D) with logits = h @ W.T + b."""
    p = logp.double().exp()[:, v].T                                # (M, N)
    d = W.double()[v, j][:, None] * h.double()[:, j].T              # (M, N)
    return p * d + torch.log1p(p * torch.expm1(-d))


def kl_unembed(logp: torch.Tensor, h: torch.Tensor, W: torch.Tensor, v=None, j=None, per_position: bool = False):
    """Zeroing W[v, j] of logits = h @ W.T + b, for pairs (v[m], j[m]) (default: every pair, v
    major): KL summed over positions (float64, (M,)) and per position ((M, N), when asked)."""
    N, V = logp.shape
    if h.ndim != 2 or h.shape[0] != N or W.shape != (V, h.shape[1]):
        raise ScanError(f"kl_unembed: logp (N, V)={tuple(logp.shape)}, h (N, D)={tuple(h.shape)}, "
                         f"W (V, D)={tuple(W.shape)} do not fit together")
    if v is None:
        v, j = (t.flatten() for t in torch.meshgrid(torch.arange(V), torch.arange(W.shape[1]), indexing="ij"))
    v, j = torch.as_tensor(v, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)
    v, j = v.to(h.device), j.to(h.device)
    if choose("scan.kl_unembed", h, dtype=(h.dtype, logp.dtype, W.dtype)) == "native":
        total, per = _cpu().kl_unembed(
            logp.detach().contiguous().numpy(), h.detach().contiguous().numpy(), W.detach().contiguous().numpy(),
            v.numpy(), j.numpy(), per_position)     # native: CPU tensors only
        return torch.from_numpy(total), (torch.from_numpy(per) if per_position else None)
    kl = kl_unembed_reference(logp, h, W, v, j)
    return kl.sum(-1), (kl.to(h.dtype) if per_position else None)


def importance_positions_reference(kl: torch.Tensor, mass: float = 0.9) -> list[np.ndarray]:
    """Per row: positions taken by decreasing KL (ties: lower first) until `mass` of the row total is
    reached, returned in position order."""
    out = []
    for row in kl.detach().double().clamp_min(0).cpu().numpy():
        total = row.sum()
        if total <= 0:
            out.append(np.zeros(0, np.int32))
            continue
        order = np.lexsort((np.arange(len(row)), -row))
        k = int(np.searchsorted(np.cumsum(row[order]), mass * total * (1 - 1e-12))) + 1
        out.append(np.sort(order[:min(k, len(row))]).astype(np.int32))
    return out


def importance_positions(kl: torch.Tensor, mass: float = 0.9) -> list[np.ndarray]:
    """For each row of kl (M, N): the smallest set of positions holding >= mass of the row's KL
    (ties broken toward lower positions), in position order."""
    if not torch.is_tensor(kl) or kl.ndim != 2:
        raise ScanError(f"importance_positions: kl must be a tensor (M, N), got "
                        f"{tuple(kl.shape) if torch.is_tensor(kl) else type(kl).__name__}")
    if isinstance(mass, bool) or not isinstance(mass, numbers.Real) or not 0 < mass <= 1:
        raise ScanError(f"mass must be a number in (0, 1], got {mass!r}")
    if kl.numel():
        lo, hi = float(kl.min()), float(kl.abs().max())
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo < -max(1e-6 * hi, 1e-6):  # rounding leaves tiny negatives
            raise ScanError(f"importance_positions: kl must be finite and >= 0 (a KL divergence), got a minimum of {lo:.3g}")
    if choose("scan.importance_positions", kl) == "native":
        offsets, pos = _cpu().importance_positions(kl.detach().float().contiguous().numpy(), mass)
        return np.split(pos, offsets[1:-1])
    return importance_positions_reference(kl.float(), mass)
