"""The DT's fused ops on the CPU through wtc._C (C++/OpenMP): the twins of the Triton kernels.

    route(...)   pointer-head routing, forward + backward (csrc/dt_route.cpp): PLE codes, the bilinear,
                 key-only and positional scores, causal mask, the counter-based Gumbel noise (the
                 bits of wtc.dt.gumbel), soft / hard / straight-through softmax, value routing and
                 the heads' overlaps; the backward reads what the forward kept (ROUTE_KEEP_BYTES)
                 or recomputes it from the inputs
    mlp_bank(...)  the sub-MLP bank on its gathered inputs, forward + backward (csrc/dt_mlp.cpp): hidden
                 layer(s) (1 or 2, every activation), output and linear skip; the backward recomputes
                 the hidden layers, nothing of size (rows, M, hidden) is stored

Same signatures and results (to float32 rounding) as the torch references in wtc.dt, which stay the
oracle (tests/test_fused_step.py). float32, and float64 for the sub-MLP bank (the precision pass's
L-BFGS: 3.4x the torch float64 step, measured below); wtc.backend.choose decides when they run (ops
"dt.route", "dt.mlp_bank"). Threads: torch's intra-op count at the call (DTConfig.threads while training); the
result does not depend on it. Instruction set: the kernels' AVX-512 / AVX2 / portable copy, chosen
when wtc._C loads from the CPU and WTC_NATIVE_ISA (wtc._native.dt_isa; one it cannot run: BackendError).
"""
from __future__ import annotations

import torch

from wtc import _native
from wtc.backend import require_native


def _module(who: str):
    """wtc._C for `who`, with its DT kernels' instruction set valid (a BackendError otherwise: not
    built, or WTC_NATIVE_ISA asks for an ISA this CPU cannot run)."""
    C = require_native(who)
    _native.dt_isa()
    return C


def _np(t: torch.Tensor):
    return t.detach().to(torch.float32).contiguous().numpy()


# The forward keeps what the backward needs (scores, probabilities, PLE codes: about 16 KB a sequence
# of a content replica at the default shape) instead of the backward recomputing it, up to this many
# bytes (wtc._C sizes it); a bigger batch recomputes (the same gradients either way,
# tests/test_fused_step.py).
ROUTE_KEEP_BYTES = 256 * 2**20


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zq, zk, val, W, u, rel, abs_, scale, content, pad, tau, hard, straight_through, seed, overlap,
                entropy):
        C = _module("the native route op")
        inputs = [t.detach().to(torch.float32).contiguous() for t in (zq, zk, val, W, u, rel, abs_, scale, content)]
        seed = -1 if seed is None else int(seed)
        keep_bytes = ROUTE_KEEP_BYTES if any(ctx.needs_input_grad[:9]) else 0
        out, o_rows, ent, kept = C.dt_route_forward(*[t.numpy() for t in inputs], pad, tau, hard, seed, overlap,
                                                    entropy, torch.get_num_threads(), keep_bytes)
        ctx.save_for_backward(*inputs)
        ctx.kept = kept if kept.size else None
        ctx.config = (pad, tau, hard, straight_through, seed, overlap)
        o_rows, ent = torch.from_numpy(o_rows), torch.from_numpy(ent)
        ctx.mark_non_differentiable(ent)
        if not overlap:
            ctx.mark_non_differentiable(o_rows)
        return torch.from_numpy(out).to(zq.dtype), o_rows.to(zq.dtype), ent

    @staticmethod
    def backward(ctx, dout, d_overlap, d_entropy):
        C = _module("the native route op")
        inputs = ctx.saved_tensors
        pad, tau, hard, straight_through, seed, overlap = ctx.config
        H = inputs[0].shape[2]
        score_grads = (not hard or straight_through) and any(ctx.needs_input_grad[i] for i in (0, 1, 3, 4, 5, 6, 7))
        c = None
        if overlap and d_overlap is not None:
            upper = torch.triu(torch.ones(H, H), diagonal=1)[:, :, None]
            g = d_overlap.detach().to(torch.float32) * upper              # only g > h entries are outputs
            c = (g + g.transpose(2, 3)).contiguous().numpy()
        grads = C.dt_route_backward(*[t.numpy() for t in inputs], pad, tau, hard, seed, _np(dout), c,
                                    score_grads, torch.get_num_threads(), ctx.kept)
        ctx.kept = None
        out = []
        for k, g in enumerate(grads):
            out.append(torch.from_numpy(g).to(inputs[k].dtype) if g is not None and ctx.needs_input_grad[k] else None)
        return (*out, None, None, None, None, None, None, None, None)


def route(zq, zk, val, W, u, rel, abs_, scale, content, *, pad: int, tau: float, hard: bool,
          straight_through: bool, seed: int | None, overlap: bool = False, entropy: bool = False):
    """Pointer-head routing on the CPU, fused; the signature and results of
    wtc.dt.attention.route_reference (and wtc.kernels.route).

    zq (R, B, H, T) and zk (R, B, H, L = T + pad) on [0, 1]; val (R, B, H, L); W (R, H, N, N);
    u (R, H, N); rel, abs_ (R, H, L); scale (R, H) > 0; content (R,) 0/1; seed None = no noise.
    Returns (out (R, B, H, T), overlaps (R, B, H, H, T) with [h, g] = sum_j p_h p_g for g > h, or None),
    and with entropy=True a third item: the entropy (nats, (R, B, H, T), no gradient) of each query's
    noise-free softmax(scores / tau), the training log's statistic (what
    entropy(softmax(Attention.scores / tau)) computes).
    """
    if tau <= 0:
        raise ValueError(f"route: tau must be > 0, got {tau}")
    if overlap and hard:
        raise ValueError("route: overlaps are defined for soft routing only (hard=False)")
    out, o_rows, ent = _Route.apply(zq, zk, val, W, u, rel, abs_, scale, content, int(pad), float(tau), bool(hard),
                                    bool(straight_through), seed, bool(overlap), bool(entropy))
    if entropy:
        return out, (o_rows if overlap else None), ent
    return out, (o_rows if overlap else None)


ACTIVATIONS = {"relu": 0, "silu": 1, "gelu": 2, "tanh": 3, "relu+silu": 4}


class _MlpBank(torch.autograd.Function):
    """float64 inputs run the kernel in float64 (the precision pass), anything else in float32."""

    @staticmethod
    def forward(ctx, x, W1, b1, W2, b2, skip, W_mid, b_mid, act):
        C = _module("the native sub-MLP op")
        dt = torch.float64 if x.dtype == torch.float64 else torch.float32
        inputs = [t.detach().to(dt).contiguous() for t in (x, W1, b1, W2, b2, skip)]
        mid = [None if t is None else t.detach().to(dt).contiguous() for t in (W_mid, b_mid)]
        op = C.dt_mlp_forward_f64 if dt == torch.float64 else C.dt_mlp_forward
        y = op(*[t.numpy() for t in inputs], act, *[None if t is None else t.numpy() for t in mid],
               torch.get_num_threads())
        ctx.save_for_backward(*inputs, *[t for t in mid if t is not None])
        ctx.act, ctx.deep, ctx.dt = act, W_mid is not None, dt
        return torch.from_numpy(y).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        C = _module("the native sub-MLP op")
        saved = ctx.saved_tensors
        inputs, mid = saved[:6], (saved[6:] if ctx.deep else (None, None))
        op = C.dt_mlp_backward_f64 if ctx.dt == torch.float64 else C.dt_mlp_backward
        grads = op(*[t.numpy() for t in inputs], ctx.act, *[None if t is None else t.numpy() for t in mid],
                   dy.detach().to(ctx.dt).contiguous().numpy(), torch.get_num_threads())
        like = list(inputs) + list(mid)
        out = [torch.from_numpy(g).to(like[k].dtype) if g is not None and ctx.needs_input_grad[k] else None
               for k, g in enumerate(grads)]
        return (*out, None)


def mlp_bank(x, W1, b1, W2, b2, skip, activation: str, W_mid=None, b_mid=None):
    """The sub-MLP bank on the CPU, fused: inputs x (R, ..., M, k) -> outputs (R, ..., M); the
    function wtc.dt.submlp.SubMLPs.evaluate computes (W1 (R, M, hidden, k), b1 (R, M, hidden),
    W2 (R, M, hidden), b2 (R, M), skip (R, M, k); W_mid (R, M, hidden, hidden), b_mid (R, M, hidden)
    for a second hidden layer)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"mlp_bank: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if (W_mid is None) != (b_mid is None):
        raise ValueError("mlp_bank: W_mid and b_mid go together")
    shape = x.shape
    R, M, k = shape[0], shape[-2], shape[-1]
    y = _MlpBank.apply(x.reshape(R, -1, M, k), W1, b1, W2, b2, skip, W_mid, b_mid, ACTIVATIONS[activation])
    return y.reshape(shape[:-1])
