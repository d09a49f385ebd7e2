"""Per-position KL(clean || ablated) of a per-weight scan on the GPU, in Triton.

    kl_rows(logp, logits)                      logp (N, V) float64, logits (A, N, V) -> (A, N) float64
    kl_rank1(logp, base, delta, direction)     logits = base + delta[a, n] * direction[a], never formed

The same arithmetic as the CPU kernels in csrc/kl.cpp (and the torch oracle kl_rows_reference):
KL = sum_v p_v (logp_v - z_v) + sum_v p_v * logsumexp(z), in float64 — a small KL is the difference
of O(1) sums, so float32 accumulation (or float32 clean log-probs) would leave ~1e-7 of noise at
every position. One program per (ablation, position) row; the ablation index varies fastest, so the
programs sharing a clean row run side by side and its float64 log-probs come from cache, not DRAM.
Two passes over the row (the max, then the sums): the second reads from L1/L2, so DRAM sees each
ablated logit once and the kernel is bound by reading the (A, N, V) float32 logits.
Non-finite inputs give non-finite KL; the launcher checks the (A, N) output (cheap) and names the row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from wtc.kernels import output


@triton.jit
def _kl_kernel(logp_ptr, z_ptr, delta_ptr, dir_ptr, out_ptr, A, N, V,
               RANK1: tl.constexpr, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    a = pid % A
    n = pid // A
    offs = tl.arange(0, BLOCK_V)
    if RANK1:
        d = tl.load(delta_ptr + a * N + n).to(tl.float64)
        z_row = z_ptr + n * V                                   # the clean logits, shared by all a
    else:
        d = 0.0
        z_row = z_ptr + (a * N + n) * V
    # pass 1: the row's max (logsumexp's shift)
    zmax = tl.full([BLOCK_V], float("-inf"), tl.float64)
    for v0 in range(0, V, BLOCK_V):
        mask = v0 + offs < V
        z = tl.load(z_row + v0 + offs, mask=mask, other=0.0).to(tl.float64)
        if RANK1:
            z += d * tl.load(dir_ptr + a * V + v0 + offs, mask=mask, other=0.0).to(tl.float64)
        zmax = tl.maximum(zmax, tl.where(mask, z, float("-inf")))
    m = tl.max(zmax, 0)
    # pass 2: sum exp(z - m), sum p (logp - z), sum p
    s = tl.zeros([BLOCK_V], tl.float64)
    pdiff = tl.zeros([BLOCK_V], tl.float64)
    pmass = tl.zeros([BLOCK_V], tl.float64)
    for v0 in range(0, V, BLOCK_V):
        mask = v0 + offs < V
        z = tl.load(z_row + v0 + offs, mask=mask, other=0.0).to(tl.float64)
        if RANK1:
            z += d * tl.load(dir_ptr + a * V + v0 + offs, mask=mask, other=0.0).to(tl.float64)
        lp = tl.load(logp_ptr + n * V + v0 + offs, mask=mask, other=0.0).to(tl.float64)
        p = tl.where(mask, tl.exp(lp), 0.0)
        s += tl.where(mask, tl.exp(z - m), 0.0)
        pdiff += tl.where(mask, p * (lp - z), 0.0)
        pmass += p
    kl = tl.sum(pdiff, 0) + tl.sum(pmass, 0) * (m + tl.log(tl.sum(s, 0)))
    tl.store(out_ptr + a * N + n, kl)


def _block_v(V: int) -> int:
    # a whole row per chunk up to 1024 (one or two loads per thread at 4 warps); longer vocabularies loop
    return min(triton.next_power_of_2(V), 1024)


def _launch(logp, z, delta, direction, A: int, rank1: bool) -> torch.Tensor:
    N, V = logp.shape
    out = output((A, N), z, torch.float64)
    if A * N:
        _kl_kernel[(A * N,)](logp, z, delta, direction, out, A, N, V, RANK1=rank1, BLOCK_V=_block_v(V),
                             num_warps=4)
    bad = ~torch.isfinite(out)
    if bad.any():
        a, n = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"non-finite KL for ablation {a} at position {n}: the clean log-probs or the "
                         f"ablated logits hold NaN or inf there")
    return out


def kl_rows(logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """(A, N) float64 KL(softmax-clean || softmax(logits[a, n])); logp (N, V) (float64 wanted)."""
    A = logits.shape[0]
    logp = logp.detach().double().contiguous()
    logits = logits.detach().contiguous()
    return _launch(logp, logits, logits, logits, A, rank1=False)


def kl_rank1(logp: torch.Tensor, base: torch.Tensor, delta: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """(A, N) float64 KL against base (N, V) + delta (A, N) [..., None] * direction (A, V)[:, None]."""
    A = delta.shape[0]
    logp = logp.detach().double().contiguous()
    return _launch(logp, base.detach().contiguous(), delta.detach().contiguous(), direction.detach().contiguous(),
                   A, rank1=True)
