"""Fused pointer-head routing (forward + backward) and aggregate heads, in Triton.

What the reference (wtc.dt.attention.route_reference) materialises as (R, B, H, T, L) tensors —
PLE codes, scores, Gumbel noise, probabilities — is computed here tile by tile and never stored:

    s(i, j) = scale * (content * (PLE(zq_i) W + u) . PLE(zk_j) + rel[i + P - j] + abs[j]),  j <= i + P
    z = s + gumbel(seed; stream, i, j)           (regenerated in backward from the seed)
    soft:  out_i = sum_j softmax(z_i / tau)_j val_j          (online softmax over key blocks)
    hard:  out_i = val[argmax_j z_i]; straight-through gradients flow through the soft softmax

The forward keeps, per query, the log-sum-exp and the soft output (and the argmax in hard mode);
the backward recomputes the probabilities from them, FlashAttention style, with one program per
(head instance, key block) that sweeps the query blocks that can see it.

Redundancy penalty: with `overlap=True` a second pass returns per-query overlaps
O[h, g, i] = sum_j p_h(i, j) p_g(i, j) for g > h (the DT's head-collapse penalty) and the backward
takes their gradient, again by recomputation.

Speed choices: PLE bins are padded to 16 lanes (tl.dot needs >= 16) and masked; dots run in ieee
fp32 (TF32 would cost the 1e-5 agreement with the reference); parameter gradients are accumulated
per (head instance) with atomics across key blocks, then summed over the batch by torch, which
keeps atomic contention to the few key blocks of one sequence.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from wtc.kernels.buffers import output as _poisoned


# ---------------------------------------------------------------- device helpers
@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _gumbel(seed, stream, i, j, L):
    """Gumbel noise for query rows i (BT,) and keys j (BL,) of head instance `stream`; the same
    bits as wtc.dt.gumbel.gumbel_hash."""
    key = _fmix32(stream.to(tl.uint32) * 0x9E3779B9 + seed.to(tl.uint32))
    counter = (i[:, None] * L + j[None, :]).to(tl.uint32)
    bits = _fmix32(key ^ counter)
    u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)      # 23 bits: u < 1 exactly
    return -tl.log(-tl.log(u))


@triton.jit
def _ple(z, n_bins, BLOCK_N: tl.constexpr):
    """PLE of z (BLOCK,) on n_bins equal bins of [0, 1] -> codes (BLOCK, BLOCK_N) and where the code
    moves with z (d code / dz = n_bins there, torch.clamp's inclusive rule)."""
    t = tl.arange(0, BLOCK_N)
    c = z[:, None] * n_bins - t[None, :].to(tl.float32)
    lo = tl.where(t == 0, float("-inf"), 0.0)[None, :]
    hi = tl.where(t == n_bins - 1, float("inf"), 1.0)[None, :]
    inside = t[None, :] < n_bins
    code = tl.where(inside, tl.minimum(tl.maximum(c, lo), hi), 0.0)
    live = inside & (c >= lo) & (c <= hi)
    return code, live


@triton.jit
def _load_w(w_ptr, rh, n_bins, BLOCK_N: tl.constexpr):
    a = tl.arange(0, BLOCK_N)
    m = (a[:, None] < n_bins) & (a[None, :] < n_bins)
    return tl.load(w_ptr + rh * n_bins * n_bins + a[:, None] * n_bins + a[None, :], mask=m, other=0.0)


@triton.jit
def _query_proj(zq_ptr, w_ptr, u_ptr, stream, rh, i, T, n_bins, BLOCK_N: tl.constexpr):
    """Queries i of one head instance -> PLE codes, their live mask, and proj = PLE(zq) W + u."""
    zq = tl.load(zq_ptr + stream * T + i, mask=i < T, other=0.0)
    enc_q, live_q = _ple(zq, n_bins, BLOCK_N)
    a = tl.arange(0, BLOCK_N)
    w = _load_w(w_ptr, rh, n_bins, BLOCK_N)
    u = tl.load(u_ptr + rh * n_bins + a, mask=a < n_bins, other=0.0)
    proj = tl.dot(enc_q, w, input_precision="ieee") + u[None, :]
    return enc_q, live_q, proj


@triton.jit
def _logits(proj, enc_k, rel_ptr, abs_ptr, rh, scale, content, seed, stream, i, j, T, L, P,
            NOISE: tl.constexpr):
    """Score tile (BT, BL): pre-scale scores `pre`, noisy scores z (-inf outside the causal mask)
    and the mask."""
    valid = (i[:, None] < T) & (j[None, :] < L) & (j[None, :] <= i[:, None] + P)
    off = tl.maximum(i[:, None] + P - j[None, :], 0)
    rel = tl.load(rel_ptr + rh * L + off, mask=valid, other=0.0)
    ab = tl.load(abs_ptr + rh * L + j, mask=j < L, other=0.0)
    pre = content * tl.dot(proj, tl.trans(enc_k), input_precision="ieee") + rel + ab[None, :]
    z = pre * scale
    if NOISE:
        z += _gumbel(seed, stream, i, j, L)
    z = tl.where(valid, z, float("-inf"))
    return pre, z, valid


@triton.jit
def _probs(zq_ptr, zk_ptr, w_ptr, u_ptr, rel_ptr, abs_ptr, scale_ptr, content_ptr, lse_ptr, seed,
           stream, rh, r, i, j, T, L, P, n_bins, inv_tau, NOISE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Soft probabilities (BT, BL) of any head instance, recomputed from its saved log-sum-exp."""
    _enc_q, _live_q, proj = _query_proj(zq_ptr, w_ptr, u_ptr, stream, rh, i, T, n_bins, BLOCK_N)
    zk = tl.load(zk_ptr + stream * L + j, mask=j < L, other=0.0)
    enc_k, _live_k = _ple(zk, n_bins, BLOCK_N)
    scale = tl.load(scale_ptr + rh)
    content = tl.load(content_ptr + r)
    _pre, z, valid = _logits(proj, enc_k, rel_ptr, abs_ptr, rh, scale, content, seed, stream, i, j, T, L, P, NOISE)
    lse = tl.load(lse_ptr + stream * T + i, mask=i < T, other=0.0)
    return tl.where(valid, tl.exp(z * inv_tau - lse[:, None]), 0.0)


# ---------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["seed"])
def _route_fwd(zq_ptr, zk_ptr, val_ptr, w_ptr, u_ptr, rel_ptr, abs_ptr, scale_ptr, content_ptr,
               out_ptr, soft_ptr, lse_ptr, idx_ptr, seed, B, H, T, L, P, n_bins, inv_tau,
               HARD: tl.constexpr, NOISE: tl.constexpr, SAVE: tl.constexpr,
               BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr):
    stream = tl.program_id(0)                    # (r * B + b) * H + h
    r = stream // (B * H)
    rh = r * H + stream % H
    i = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    _enc_q, _live_q, proj = _query_proj(zq_ptr, w_ptr, u_ptr, stream, rh, i, T, n_bins, BLOCK_N)
    scale = tl.load(scale_ptr + rh)
    content = tl.load(content_ptr + r)
    m = tl.full((BLOCK_T,), float("-inf"), tl.float32)    # running max of z / tau
    l = tl.zeros((BLOCK_T,), tl.float32)                   # running sum of exp(z / tau - m)
    acc = tl.zeros((BLOCK_T,), tl.float32)                 # running sum of exp(...) * val
    best = tl.full((BLOCK_T,), float("-inf"), tl.float32)  # hard: best z so far, its key and value
    best_j = tl.zeros((BLOCK_T,), tl.int32)
    best_v = tl.zeros((BLOCK_T,), tl.float32)
    j_end = tl.minimum(L, tl.program_id(1) * BLOCK_T + BLOCK_T + P)   # keys the last query can see
    for j0 in range(0, j_end, BLOCK_L):
        j = j0 + tl.arange(0, BLOCK_L)
        zk = tl.load(zk_ptr + stream * L + j, mask=j < L, other=0.0)
        enc_k, _live_k = _ple(zk, n_bins, BLOCK_N)
        v = tl.load(val_ptr + stream * L + j, mask=j < L, other=0.0)
        _pre, z, valid = _logits(proj, enc_k, rel_ptr, abs_ptr, rh, scale, content, seed, stream, i, j, T, L, P, NOISE)
        if HARD:
            blk = tl.max(z, axis=1)
            arg = tl.argmax(z, axis=1, tie_break_left=True)                  # first maximum, like torch
            hit = tl.arange(0, BLOCK_L)[None, :] == arg[:, None]
            better = blk > best                                               # strict: earlier key wins ties
            best_v = tl.where(better, tl.sum(tl.where(hit, v[None, :], 0.0), axis=1), best_v)
            best_j = tl.where(better, j0 + arg.to(tl.int32), best_j)
            best = tl.where(better, blk, best)
        if SAVE or not HARD:
            x = z * inv_tau
            m_new = tl.maximum(m, tl.max(x, axis=1))
            p = tl.exp(x - m_new[:, None])
            alpha = tl.exp(m - m_new)
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha + tl.sum(p * v[None, :], axis=1)
            m = m_new
    row = i < T
    if HARD:
        tl.store(out_ptr + stream * T + i, best_v, mask=row)
    else:
        tl.store(out_ptr + stream * T + i, acc / l, mask=row)
    if SAVE:
        tl.store(soft_ptr + stream * T + i, acc / l, mask=row)
        tl.store(lse_ptr + stream * T + i, m + tl.log(l), mask=row)
        tl.store(idx_ptr + stream * T + i, best_j, mask=row)


@triton.jit(do_not_specialize=["seed"])
def _route_overlap(zq_ptr, zk_ptr, w_ptr, u_ptr, rel_ptr, abs_ptr, scale_ptr, content_ptr, lse_ptr,
                   o_ptr, seed, B, H, T, L, P, n_bins, inv_tau,
                   NOISE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr):
    """O[stream, g, i] = sum_j p_h(i, j) p_g(i, j) for the heads g > h of the same sequence."""
    stream = tl.program_id(0)
    r = stream // (B * H)
    h = stream % H
    i = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    j_end = tl.minimum(L, tl.program_id(1) * BLOCK_T + BLOCK_T + P)
    for g in range(h + 1, H):
        other = stream - h + g
        acc = tl.zeros((BLOCK_T,), tl.float32)
        for j0 in range(0, j_end, BLOCK_L):
            j = j0 + tl.arange(0, BLOCK_L)
            p_h = _probs(zq_ptr, zk_ptr, w_ptr, u_ptr, rel_ptr, abs_ptr, scale_ptr, content_ptr, lse_ptr, seed,
                         stream, r * H + h, r, i, j, T, L, P, n_bins, inv_tau, NOISE, BLOCK_N)
            p_g = _probs(zq_ptr, zk_ptr, w_ptr, u_ptr, rel_ptr, abs_ptr, scale_ptr, content_ptr, lse_ptr, seed,
                         other, r * H + g, r, i, j, T, L, P, n_bins, inv_tau, NOISE, BLOCK_N)
            acc += tl.sum(p_h * p_g, axis=1)
        tl.store(o_ptr + (stream * H + g) * T + i, acc, mask=i < T)


@triton.jit(do_not_specialize=["seed"])
def _route_bwd(zq_ptr, zk_ptr, val_ptr, w_ptr, u_ptr, rel_ptr, abs_ptr, scale_ptr, content_ptr,
               dout_ptr, lse_ptr, d_ptr, idx_ptr, c_ptr,
               dzq_ptr, dzk_ptr, dval_ptr, dw_ptr, du_ptr, drel_ptr, dabs_ptr, dscale_ptr,
               seed, B, H, T, L, P, n_bins, inv_tau,
               HARD: tl.constexpr, NOISE: tl.constexpr, SCORE_GRADS: tl.constexpr, OVERLAP: tl.constexpr,
               BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (head instance, key block): sweeps the query blocks that see these keys.

    ds(i, j) = p(i, j) (dp(i, j) - D_i) / tau with dp = dout_i val_j + sum_g C[h, g, i] p_g(i, j)
    and D_i = sum_j p dp (computed by the launcher from the forward's soft output and overlaps).
    """
    stream = tl.program_id(0)
    r = stream // (B * H)
    h = stream % H
    rh = r * H + h
    j = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    col = j < L
    v = tl.load(val_ptr + stream * L + j, mask=col, other=0.0)
    zk = tl.load(zk_ptr + stream * L + j, mask=col, other=0.0)
    enc_k, live_k = _ple(zk, n_bins, BLOCK_N)
    scale = tl.load(scale_ptr + rh)
    content = tl.load(content_ptr + r)
    w = _load_w(w_ptr, rh, n_bins, BLOCK_N)
    dval = tl.zeros((BLOCK_L,), tl.float32)
    denc_k = tl.zeros((BLOCK_L, BLOCK_N), tl.float32)
    dabs = tl.zeros((BLOCK_L,), tl.float32)
    dw = tl.zeros((BLOCK_N, BLOCK_N), tl.float32)
    du = tl.zeros((BLOCK_N,), tl.float32)
    dscale = tl.zeros((BLOCK_L,), tl.float32)
    first = tl.maximum(tl.program_id(1) * BLOCK_L - P, 0) // BLOCK_T * BLOCK_T   # first query that sees j
    for i0 in range(first, T, BLOCK_T):
        i = i0 + tl.arange(0, BLOCK_T)
        row = i < T
        dout = tl.load(dout_ptr + stream * T + i, mask=row, other=0.0)
        enc_q, live_q, proj = _query_proj(zq_ptr, w_ptr, u_ptr, stream, rh, i, T, n_bins, BLOCK_N)
        pre, z, valid = _logits(proj, enc_k, rel_ptr, abs_ptr, rh, scale, content, seed, stream, i, j, T, L, P, NOISE)
        lse = tl.load(lse_ptr + stream * T + i, mask=row, other=0.0)
        p = tl.where(valid, tl.exp(z * inv_tau - lse[:, None]), 0.0)
        if HARD:
            best = tl.load(idx_ptr + stream * T + i, mask=row, other=-1)
            dval += tl.sum(tl.where(j[None, :] == best[:, None], dout[:, None], 0.0), axis=0)
        else:
            dval += tl.sum(p * dout[:, None], axis=0)
        if SCORE_GRADS:
            dp = dout[:, None] * v[None, :]
            if OVERLAP:
                for g in range(0, H):
                    if g != h:
                        c = tl.load(c_ptr + (stream * H + g) * T + i, mask=row, other=0.0)
                        p_g = _probs(zq_ptr, zk_ptr, w_ptr, u_ptr, rel_ptr, abs_ptr, scale_ptr, content_ptr, lse_ptr,
                                     seed, stream - h + g, r * H + g, r, i, j, T, L, P, n_bins, inv_tau, NOISE,
                                     BLOCK_N)
                        dp += c[:, None] * p_g
            dd = tl.load(d_ptr + stream * T + i, mask=row, other=0.0)
            ds = tl.where(valid, p * (dp - dd[:, None]) * inv_tau, 0.0)   # d loss / d z (= d / d s)
            dscale += tl.sum(ds * pre, axis=0)
            dpre = ds * scale
            dabs += tl.sum(dpre, axis=0)
            off = tl.maximum(i[:, None] + P - j[None, :], 0)
            tl.atomic_add(drel_ptr + stream * L + off, dpre, mask=valid)
            dsc = dpre * content                                                # (BT, BL) content term
            dproj = tl.dot(dsc, enc_k, input_precision="ieee")                 # (BT, N)
            denc_k += tl.dot(tl.trans(dsc), proj, input_precision="ieee")      # (BL, N)
            dw += tl.dot(tl.trans(enc_q), dproj, input_precision="ieee")       # (N, N)
            du += tl.sum(dproj, axis=0)
            denc_q = tl.dot(dproj, tl.trans(w), input_precision="ieee")        # (BT, N)
            dzq = tl.sum(tl.where(live_q, denc_q, 0.0), axis=1) * n_bins
            tl.atomic_add(dzq_ptr + stream * T + i, dzq, mask=row)
    tl.store(dval_ptr + stream * L + j, dval, mask=col)
    if SCORE_GRADS:
        tl.store(dzk_ptr + stream * L + j, tl.sum(tl.where(live_k, denc_k, 0.0), axis=1) * n_bins, mask=col)
        tl.store(dabs_ptr + stream * L + j, dabs, mask=col)
        a = tl.arange(0, BLOCK_N)
        inside = a < n_bins
        tl.atomic_add(dw_ptr + stream * n_bins * n_bins + a[:, None] * n_bins + a[None, :], dw,
                      mask=inside[:, None] & inside[None, :])
        tl.atomic_add(du_ptr + stream * n_bins + a, du, mask=inside)
        tl.atomic_add(dscale_ptr + stream, tl.sum(dscale, axis=0))


@triton.jit
def _aggregate_fwd(val_ptr, out_ptr, T, BLOCK: tl.constexpr):
    s = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    v = tl.load(val_ptr + s * T + i, mask=i < T, other=0.0)
    tl.store(out_ptr + s * T + i, tl.cumsum(v, axis=0) / (i + 1).to(tl.float32), mask=i < T)


@triton.jit
def _aggregate_bwd(dout_ptr, dval_ptr, T, BLOCK: tl.constexpr):
    s = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    d = tl.load(dout_ptr + s * T + i, mask=i < T, other=0.0) / (i + 1).to(tl.float32)
    tl.store(dval_ptr + s * T + i, tl.cumsum(d, axis=0, reverse=True), mask=i < T)


# ---------------------------------------------------------------- launchers and autograd
BLOCK_T = 16
BLOCK_N_MIN = 16   # tl.dot's smallest tile


def _blocks(L: int, n_bins: int) -> tuple[int, int]:
    block_l = min(64, max(16, triton.next_power_of_2(L)))
    return block_l, max(BLOCK_N_MIN, triton.next_power_of_2(n_bins))


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous()


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zq, zk, val, W, u, rel, abs_, scale, content, pad, tau, hard, straight_through, seed, overlap):
        R, B, H, T = zq.shape
        L, N = zk.shape[-1], W.shape[-1]
        if zk.shape != (R, B, H, L) or val.shape != (R, B, H, L):
            raise ValueError(f"route: zk {tuple(zk.shape)} and val {tuple(val.shape)} must be (R, B, H, L) = "
                             f"{(R, B, H, L)}")
        if L != T + pad:
            raise ValueError(f"route: keys L={L} must equal T + pad = {T} + {pad}")
        args = [_f32(t) for t in (zq, zk, val, W, u, rel, abs_, scale, content)]
        block_l, block_n = _blocks(L, N)
        save = any(ctx.needs_input_grad[:8])
        out = _poisoned((R, B, H, T), zq)
        soft, lse = _poisoned((R, B, H, T), zq), _poisoned((R, B, H, T), zq)
        idx = _poisoned((R, B, H, T), zq, torch.int32)
        inv_tau = 1.0 / tau
        grid = (R * B * H, triton.cdiv(T, BLOCK_T))
        noise = seed is not None
        seed = int(seed or 0)
        _route_fwd[grid](*args, out, soft, lse, idx, seed, B, H, T, L, pad, N, inv_tau,
                         HARD=hard, NOISE=noise, SAVE=save or overlap,
                         BLOCK_T=BLOCK_T, BLOCK_L=block_l, BLOCK_N=block_n)
        o_rows = zq.new_zeros(0)
        if overlap:
            o_rows = torch.zeros((R, B, H, H, T), dtype=torch.float32, device=zq.device)
            _route_overlap[grid](*[args[k] for k in (0, 1, 3, 4, 5, 6, 7, 8)], lse, o_rows, seed, B, H, T, L, pad,
                                 N, inv_tau, NOISE=noise, BLOCK_T=BLOCK_T, BLOCK_L=block_l, BLOCK_N=block_n)
        ctx.save_for_backward(*args, soft, lse, idx, o_rows)
        ctx.config = (pad, inv_tau, hard, straight_through, noise, seed, overlap, block_l, block_n)
        if not overlap:
            ctx.mark_non_differentiable(o_rows)
        return out.to(zq.dtype), o_rows.to(zq.dtype)

    @staticmethod
    def backward(ctx, dout, d_overlap):
        zq, zk, val, W, u, rel, abs_, scale, content, soft, lse, idx, o_rows = ctx.saved_tensors
        pad, inv_tau, hard, straight_through, noise, seed, overlap, block_l, block_n = ctx.config
        R, B, H, T = zq.shape
        L, N = zk.shape[-1], W.shape[-1]
        dout = _f32(dout)
        score_grads = (not hard or straight_through) and any(ctx.needs_input_grad[i] for i in (0, 1, 3, 4, 5, 6, 7))
        # D_i = sum_j p dp = dout_i * soft_out_i + sum_g C[h, g, i] O[h, g, i]
        d_rows = dout * soft
        c = zq.new_zeros(0)
        if overlap and d_overlap is not None:
            upper = torch.triu(torch.ones(H, H, device=zq.device), diagonal=1)[:, :, None]
            g = _f32(d_overlap) * upper                                  # only g > h entries are outputs
            c = (g + g.transpose(2, 3)).contiguous()                      # (R, B, H, H, T)
            d_rows = d_rows + (c * (o_rows + o_rows.transpose(2, 3))).sum(dim=3)   # O is symmetric
        use_overlap = c.numel() > 0
        zeros = lambda *shape: torch.zeros(shape, dtype=torch.float32, device=zq.device)  # noqa: E731
        dzq, dzk, dval = zeros(R, B, H, T), _poisoned((R, B, H, L), zq), _poisoned((R, B, H, L), zq)
        dw, du = zeros(R, B, H, N, N), zeros(R, B, H, N)
        drel, dabs, dscale = zeros(R, B, H, L), _poisoned((R, B, H, L), zq), zeros(R, B, H)
        if not score_grads:
            dzk.zero_(), dabs.zero_()
        grid = (R * B * H, triton.cdiv(L, block_l))
        _route_bwd[grid](zq, zk, val, W, u, rel, abs_, scale, content, dout, lse, d_rows.contiguous(), idx, c,
                         dzq, dzk, dval, dw, du, drel, dabs, dscale, seed, B, H, T, L, pad, N, inv_tau,
                         HARD=hard, NOISE=noise, SCORE_GRADS=score_grads, OVERLAP=use_overlap,
                         BLOCK_T=BLOCK_T, BLOCK_L=block_l, BLOCK_N=block_n)
        grads = [dzq, dzk, dval, dw.sum(1), du.sum(1), drel.sum(1), dabs.sum(1), dscale.sum(1)]
        wanted = [need and (k == 2 or score_grads) for k, need in enumerate(ctx.needs_input_grad[:8])]
        return (*[g if want else None for g, want in zip(grads, wanted)],
                None, None, None, None, None, None, None)


def route(zq, zk, val, W, u, rel, abs_, scale, content, *, pad: int, tau: float, hard: bool,
          straight_through: bool, seed: int | None, overlap: bool = False):
    """Pointer-head routing, fused; same signature and results as wtc.dt.attention.route_reference.

    zq (R, B, H, T) and zk (R, B, H, L = T + pad) on [0, 1]; val (R, B, H, L); W (R, H, N, N);
    u (R, H, N); rel, abs_ (R, H, L); scale (R, H) > 0; content (R,) 0/1; seed None = no noise.
    hard: argmax forward (straight_through: soft gradients to the scores; else none).
    Returns (out (R, B, H, T), overlaps (R, B, H, H, T) with [h, g] = sum_j p_h p_g for g > h, or None).
    """
    if tau <= 0:
        raise ValueError(f"route: tau must be > 0, got {tau}")
    if overlap and hard:
        raise ValueError("route: overlaps are defined for soft routing only (hard=False)")
    out, o_rows = _Route.apply(zq, zk, val, W, u, rel, abs_, scale, content, pad, float(tau), bool(hard),
                               bool(straight_through), seed, bool(overlap))
    return out, (o_rows if overlap else None)


class _Aggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, val):
        flat = _f32(val).reshape(-1, val.shape[-1])
        S, T = flat.shape
        out = _poisoned((S, T), val)
        block = triton.next_power_of_2(T)
        _aggregate_fwd[(S,)](flat, out, T, BLOCK=block)
        ctx.shape, ctx.dtype, ctx.block = val.shape, val.dtype, block
        return out.reshape(val.shape).to(val.dtype)

    @staticmethod
    def backward(ctx, dout):
        flat = _f32(dout).reshape(-1, ctx.shape[-1])
        S, T = flat.shape
        dval = _poisoned((S, T), dout)
        _aggregate_bwd[(S,)](flat, dval, T, BLOCK=ctx.block)
        return dval.reshape(ctx.shape).to(ctx.dtype)


def aggregate(val: torch.Tensor) -> torch.Tensor:
    """Aggregate heads: val (..., T) -> the causal running mean (..., T); one program per row."""
    if val.shape[-1] == 0 or val.numel() == 0:
        return val.clone()
    return _Aggregate.apply(val)
