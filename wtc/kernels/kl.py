"""Per-position KL(clean || ablated) of a per-weight scan on the GPU, in Triton.

    kl_rows(logp, logits)                      logp (N, V) float64, logits (A, N, V) -> (A, N) float64
    kl_rank1(logp, base, delta, direction)     logits = base + delta[a, n] * direction[a], never formed

The same arithmetic as the CPU kernels in csrc/kl.cpp (and the torch oracle kl_rows_reference):
KL = sum_v p_v (logp_v - z_v) + sum_v p_v * logsumexp(z), in float64 — a small KL is the difference
of O(1) sums, so float32 accumulation (or float32 clean log-probs) would leave ~1e-7 of noise at
every position. For vocabularies up to 1024, one program per position and tile of ablations (see
tile_shape): the clean row's p = exp(logp) is computed once and kept in registers for all of them
(float64 exp is the costly part on a GPU, a fraction of float32's rate), and each ablated row is read
once.
Longer vocabularies loop over chunks in two passes (the max, then the sums; the second reads
from cache), so DRAM still sees each ablated logit once.
Non-finite inputs give non-finite KL; the launcher checks the (A, N) output (cheap) and names the row.
"""
from __future__ import annotations

import os

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
def _kl_tile_kernel(logp_ptr, z_ptr, delta_ptr, dir_ptr, out_ptr, A, N, V,
                    RANK1: tl.constexpr, BLOCK_V: tl.constexpr, A_PER: tl.constexpr):
    """Vocabularies that fit one chunk: a program takes A_PER ablations of one position as one
    (A_PER, BLOCK_V) tile. Every row's loads are in flight at once and the three row reductions run
    side by side, where a loop over the rows would wait on each row's load and reductions in turn."""
    pid = tl.program_id(0).to(tl.int64)
    blocks_of_a = tl.cdiv(A, A_PER)
    n = pid // blocks_of_a
    a = (pid % blocks_of_a) * A_PER + tl.arange(0, A_PER)                 # (A_PER,)
    offs = tl.arange(0, BLOCK_V)
    vmask = offs < V
    # the clean row once per program: float64 exp is the costly part on a GPU (a fraction of
    # float32's rate), so p is computed once for all the tile's ablations
    lp = tl.load(logp_ptr + n * V + offs, mask=vmask, other=0.0).to(tl.float64)
    p = tl.where(vmask, tl.exp(lp), 0.0)
    p_lp = tl.sum(p * lp, 0)
    p_mass = tl.sum(p, 0)
    amask = a < A
    mask = amask[:, None] & vmask[None, :]
    if RANK1:
        d = tl.load(delta_ptr + a * N + n, mask=amask, other=0.0).to(tl.float64)
        base = tl.load(z_ptr + n * V + offs, mask=vmask, other=0.0).to(tl.float64)   # shared by all a
        direction = tl.load(dir_ptr + a[:, None] * V + offs[None, :], mask=mask, other=0.0).to(tl.float64)
        z = base[None, :] + d[:, None] * direction
    else:
        z = tl.load(z_ptr + (a[:, None] * N + n) * V + offs[None, :], mask=mask, other=0.0).to(tl.float64)
    m = tl.max(tl.where(mask, z, float("-inf")), 1)                       # (A_PER,)
    m = tl.where(amask, m, 0.0)
    s = tl.sum(tl.where(mask, tl.exp(z - m[:, None]), 0.0), 1)
    s = tl.where(amask, s, 1.0)
    kl = p_lp - tl.sum(p[None, :] * z, 1) + p_mass * (m + tl.log(s))
    tl.store(out_ptr + a * N + n, kl, mask=amask)


@triton.jit
def _kl_chunked_kernel(logp_ptr, z_ptr, delta_ptr, dir_ptr, out_ptr, A, N, V,
                       RANK1: tl.constexpr, BLOCK_V: tl.constexpr, A_PER: tl.constexpr):
    """Longer vocabularies: each row in chunks, two passes (the max, then the sums; the second
    reads from cache), so DRAM still sees each ablated logit once."""
    pid = tl.program_id(0).to(tl.int64)
    blocks_of_a = tl.cdiv(A, A_PER)
    n = pid // blocks_of_a
    a0 = (pid % blocks_of_a) * A_PER
    offs = tl.arange(0, BLOCK_V)
    lp_row = logp_ptr + n * V
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


# A tile of TILE_ELEMENTS float64 logits per program: 32 per thread at 4 warps keeps enough loads in
# flight to cover DRAM latency, and registers for z, exp(z - m) and p.  WTC_KL_TILE=elements,warps
# overrides it (bench/ablation.py --kl-sweep measures the choices on a GPU).
TILE_ELEMENTS, TILE_WARPS = 4096, 4


def tile_shape(A: int, block_v: int) -> tuple[int, int]:
    """(ablations per program, warps) of the one-chunk kernel: a power of two."""
    elements, warps = TILE_ELEMENTS, TILE_WARPS
    env = os.environ.get("WTC_KL_TILE")
    if env:
        elements, warps = (int(v) for v in env.split(","))
    a_per = max(1, min(triton.next_power_of_2(A), elements // block_v))
    return a_per, warps


def _block_v(V: int) -> int:
    # a whole row per chunk up to 1024 (one or two loads per thread at 4 warps); longer vocabularies loop
    return min(triton.next_power_of_2(V), 1024)


def _launch(logp, z, delta, direction, A: int, rank1: bool) -> torch.Tensor:
    N, V = logp.shape
    out = output((A, N), z, torch.float64)
    if A * N:
        block_v = _block_v(V)
        if V <= block_v:
            a_per, warps = tile_shape(A, block_v)
            _kl_tile_kernel[(N * triton.cdiv(A, a_per),)](logp, z, delta, direction, out, A, N, V, RANK1=rank1,
                                                          BLOCK_V=block_v, A_PER=a_per, num_warps=warps)
        else:
            a_per = min(A, 8)
            _kl_chunked_kernel[(N * triton.cdiv(A, a_per),)](logp, z, delta, direction, out, A, N, V,
                                                             RANK1=rank1, BLOCK_V=block_v, A_PER=a_per, num_warps=4)
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
