"""Per-position KL(clean || ablated) of a per-weight scan on the GPU, in Triton.

    kl_rows(logp, logits)                      logp (N, V) float64, logits (A, N, V) -> (A, N) float64
    kl_rank1(logp, base, delta, direction)     logits = base + delta[a, n] * direction[a], never formed

The same arithmetic as the CPU kernels in csrc/kl.cpp (and the torch oracle kl_rows_reference):
KL = sum_v p_v (logp_v - z_v) + sum_v p_v * logsumexp(z), in float64 — a small KL is the difference
of O(1) sums, so float32 accumulation (or float32 clean log-probs) would leave ~1e-7 of noise at
every position. One program per position and block of up to 8 ablations: for vocabularies up to
1024 the clean row's p = exp(logp) is computed once and kept in registers for all of them (float64
exp is the costly part on a GPU, a fraction of float32's rate), and each ablated row is read once.
Longer vocabularies loop over chunks in two passes (the max, then the sums; the second reads
from cache), so DRAM still sees each ablated logit once.
Non-finite inputs give non-finite KL; the launcher checks the (A, N) output (cheap) and names the row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from wtc.kernels.buffers import output


@triton.jit
def _logits(z_row, dir_row, d, v0, offs, mask, RANK1: tl.constexpr):
    """One chunk of an ablated row, float64: z, or base + d * direction for a rank-1 ablation."""
    z = tl.load(z_row + v0 + offs, mask=mask, other=0.0).to(tl.float64)
    if RANK1:
        z += d * tl.load(dir_row + v0 + offs, mask=mask, other=0.0).to(tl.float64)
    return z


@triton.jit
def _kl_kernel(logp_ptr, z_ptr, delta_ptr, dir_ptr, out_ptr, A, N, V,
               RANK1: tl.constexpr, BLOCK_V: tl.constexpr, ONE_CHUNK: tl.constexpr, A_PER: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    blocks_of_a = tl.cdiv(A, A_PER)
    n = pid // blocks_of_a
    a0 = (pid % blocks_of_a) * A_PER
    offs = tl.arange(0, BLOCK_V)
    lp_row = logp_ptr + n * V
    if ONE_CHUNK:
        # the clean row once per program, in registers for all its ablations: float64 exp is the
        # costly part on a GPU (a fraction of float32's rate), so p is not recomputed per ablation
        mask = offs < V
        lp = tl.load(lp_row + offs, mask=mask, other=0.0).to(tl.float64)
        p = tl.where(mask, tl.exp(lp), 0.0)
        p_lp = tl.sum(p * lp, 0)
        p_mass = tl.sum(p, 0)
    for i in range(0, A_PER):
        a = a0 + i
        if a < A:
            if RANK1:
                d = tl.load(delta_ptr + a * N + n).to(tl.float64)
                z_row = z_ptr + n * V                            # the clean logits, shared by all a
            else:
                d = 0.0
                z_row = z_ptr + (a * N + n) * V
            dir_row = dir_ptr + a * V
            if ONE_CHUNK:
                z = _logits(z_row, dir_row, d, 0, offs, mask, RANK1)
                m = tl.max(tl.where(mask, z, float("-inf")), 0)
                s = tl.sum(tl.where(mask, tl.exp(z - m), 0.0), 0)
                kl = p_lp - tl.sum(p * z, 0) + p_mass * (m + tl.log(s))
            else:
                # pass 1: the row's max (logsumexp's shift); pass 2 re-reads the row from cache
                zmax = tl.full([BLOCK_V], float("-inf"), tl.float64)
                for v0 in range(0, V, BLOCK_V):
                    cmask = v0 + offs < V
                    zmax = tl.maximum(zmax, tl.where(cmask, _logits(z_row, dir_row, d, v0, offs, cmask, RANK1),
                                                     float("-inf")))
                m = tl.max(zmax, 0)
                s = tl.zeros([BLOCK_V], tl.float64)
                pdiff = tl.zeros([BLOCK_V], tl.float64)
                pm = tl.zeros([BLOCK_V], tl.float64)
                for v0 in range(0, V, BLOCK_V):
                    cmask = v0 + offs < V
                    z = _logits(z_row, dir_row, d, v0, offs, cmask, RANK1)
                    lpc = tl.load(lp_row + v0 + offs, mask=cmask, other=0.0).to(tl.float64)
                    pc = tl.where(cmask, tl.exp(lpc), 0.0)
                    s += tl.where(cmask, tl.exp(z - m), 0.0)
                    pdiff += pc * (lpc - z)
                    pm += pc
                kl = tl.sum(pdiff, 0) + tl.sum(pm, 0) * (m + tl.log(tl.sum(s, 0)))
            tl.store(out_ptr + a * N + n, kl)


def _block_v(V: int) -> int:
    # a whole row per chunk up to 1024 (one or two loads per thread at 4 warps); longer vocabularies loop
    return min(triton.next_power_of_2(V), 1024)


def _launch(logp, z, delta, direction, A: int, rank1: bool) -> torch.Tensor:
    N, V = logp.shape
    out = output((A, N), z, torch.float64)
    if A * N:
        block_v, a_per = _block_v(V), min(A, 8)
        _kl_kernel[(N * triton.cdiv(A, a_per),)](logp, z, delta, direction, out, A, N, V, RANK1=rank1,
                                                 BLOCK_V=block_v, ONE_CHUNK=V <= block_v, A_PER=a_per, num_warps=4)
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
