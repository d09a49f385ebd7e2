"""All sub-MLPs of a DT layer in one launch (forward + backward), in Triton.

Sub-MLP m of replica r reads k inputs from the stream — a soft mixture over the V variables
during annealing (selection weights S (R, M*k, V)), or fixed variables once frozen (indices
(R, M*k)) — and maps them through one hidden layer plus a linear skip to a scalar:

    x = stream @ S[m]^T                              (rows, k)
    y = act(x W1^T + b1) . W2 + b2 + x . skip        (rows,)
    depth 2: act(act(x W1^T + b1) W_mid^T + b_mid) in place of the hidden layer

Reference: wtc.dt.submlp.SubMLPs (Choice.read then evaluate). One program per (replica, sub-MLP,
block of rows): the stream tile is read once per sub-MLP and nothing of size (rows, M, hidden)
is ever stored; the backward recomputes the hidden layer. It returns the gradient of the gathered
inputs dx (R, rows, M*k); the launcher turns it into the gradients of the stream and of the
selection weights with two batched GEMMs (cuBLAS does those better than a scatter in the
kernel, and the selection logits' gradient then follows through torch's softmax).
Parameter gradients are written per (replica, sub-MLP, row split) and summed by torch, so no
atomics and a deterministic result.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from wtc.kernels.buffers import output
from wtc.kernels.products import split_product

ACTIVATIONS = {"relu": 0, "silu": 1, "gelu": 2, "tanh": 3, "relu+silu": 4}


@triton.jit
def _act(h, unit, half, ACT: tl.constexpr):
    """Activation and its derivative; unit (BH,) is the hidden unit index (relu+silu splits at half)."""
    sig = 1.0 / (1.0 + tl.exp(-h))
    if ACT == 0:
        a, da = tl.maximum(h, 0.0), (h > 0).to(tl.float32)
    elif ACT == 1:
        a, da = h * sig, sig * (1.0 + h * (1.0 - sig))
    elif ACT == 2:    # exact (erf) GELU, torch's default
        cdf = 0.5 * (1.0 + tl.math.erf(h * 0.7071067811865476))
        a, da = h * cdf, cdf + h * 0.3989422804014327 * tl.exp(-0.5 * h * h)
    elif ACT == 3:
        t = 2.0 / (1.0 + tl.exp(-2.0 * h)) - 1.0
        a, da = t, 1.0 - t * t
    else:             # first half ReLU (exact kinks), second half SiLU (smooth)
        relu = (unit < half)[None, :]
        a = tl.where(relu, tl.maximum(h, 0.0), h * sig)
        da = tl.where(relu, (h > 0).to(tl.float32), sig * (1.0 + h * (1.0 - sig)))
    return a, da


@triton.jit
def _inputs(stream_ptr, sel_ptr, r, m, rows, n_rows, V, K: tl.constexpr, INDEXED: tl.constexpr,
            BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """The k inputs of sub-MLP m for a block of rows -> (BR, BK), zero outside."""
    kk = tl.arange(0, BLOCK_K)
    row_ok = rows < n_rows
    base = stream_ptr + r * n_rows * V + rows[:, None] * V
    if INDEXED:
        var = tl.load(sel_ptr + m * K + kk, mask=kk < K, other=0)                                  # (BK,)
        return tl.load(base + var[None, :], mask=row_ok[:, None] & (kk < K)[None, :], other=0.0)
    else:
        v = tl.arange(0, BLOCK_V)
        tile = tl.load(base + v[None, :], mask=row_ok[:, None] & (v < V)[None, :], other=0.0)      # (BR, BV)
        sel = tl.load(sel_ptr + (m * K + kk[:, None]) * V + v[None, :],
                      mask=(kk < K)[:, None] & (v < V)[None, :], other=0.0)                        # (BK, BV)
        return tl.sum(tile[:, None, :] * sel[None, :, :], axis=2)


@triton.jit
def _params(w1_ptr, b1_ptr, w2_ptr, skip_ptr, rm, hidden, K: tl.constexpr, BLOCK_H: tl.constexpr,
            BLOCK_K: tl.constexpr):
    hh = tl.arange(0, BLOCK_H)
    kk = tl.arange(0, BLOCK_K)
    w1 = tl.load(w1_ptr + rm * hidden * K + hh[:, None] * K + kk[None, :],
                 mask=(hh < hidden)[:, None] & (kk < K)[None, :], other=0.0)                      # (BH, BK)
    b1 = tl.load(b1_ptr + rm * hidden + hh, mask=hh < hidden, other=0.0)
    w2 = tl.load(w2_ptr + rm * hidden + hh, mask=hh < hidden, other=0.0)
    skip = tl.load(skip_ptr + rm * K + kk, mask=kk < K, other=0.0)
    return w1, b1, w2, skip


@triton.jit
def _load_mid(wmid_ptr, bmid_ptr, rm, hidden, BLOCK_H: tl.constexpr):
    """Second hidden layer of sub-MLP rm: W_mid (BH, BH) as [to unit g, from unit h], b_mid (BH,)."""
    hh = tl.arange(0, BLOCK_H)
    live = hh < hidden
    wmid = tl.load(wmid_ptr + rm * hidden * hidden + hh[:, None] * hidden + hh[None, :],
                   mask=live[:, None] & live[None, :], other=0.0)
    bmid = tl.load(bmid_ptr + rm * hidden + hh, mask=live, other=0.0)
    return wmid, bmid


@triton.jit
def _bank_fwd(stream_ptr, sel_ptr, w1_ptr, b1_ptr, wmid_ptr, bmid_ptr, w2_ptr, b2_ptr, skip_ptr, y_ptr,
              M, n_rows, V, hidden, half, sel_stride,
              K: tl.constexpr, ACT: tl.constexpr, INDEXED: tl.constexpr, DEPTH2: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    rm = tl.program_id(0)                    # r * M + m
    r, m = rm // M, rm % M
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    x = _inputs(stream_ptr, sel_ptr + r * sel_stride, r, m, rows, n_rows, V, K, INDEXED,
                BLOCK_K, BLOCK_V)                                                                  # (BR, BK)
    w1, b1, w2, skip = _params(w1_ptr, b1_ptr, w2_ptr, skip_ptr, rm, hidden, K, BLOCK_H, BLOCK_K)
    h = tl.sum(x[:, None, :] * w1[None, :, :], axis=2) + b1[None, :]                              # (BR, BH)
    a, _ = _act(h, tl.arange(0, BLOCK_H), half, ACT)
    a = tl.where((tl.arange(0, BLOCK_H) < hidden)[None, :], a, 0.0)
    if DEPTH2:
        wmid, bmid = _load_mid(wmid_ptr, bmid_ptr, rm, hidden, BLOCK_H)
        h2 = tl.dot(a, tl.trans(wmid), input_precision="ieee") + bmid[None, :]
        a, _ = _act(h2, tl.arange(0, BLOCK_H), half, ACT)
        a = tl.where((tl.arange(0, BLOCK_H) < hidden)[None, :], a, 0.0)
    y = tl.sum(a * w2[None, :], axis=1) + tl.load(b2_ptr + rm) + tl.sum(x * skip[None, :], axis=1)
    tl.store(y_ptr + (r * n_rows + rows) * M + m, y, mask=rows < n_rows)


@triton.jit
def _bank_bwd(stream_ptr, sel_ptr, w1_ptr, b1_ptr, wmid_ptr, bmid_ptr, w2_ptr, skip_ptr, dy_ptr, dx_ptr,
              dw1_ptr, db1_ptr, dwmid_ptr, dbmid_ptr, dw2_ptr, db2_ptr, dskip_ptr,
              M, n_rows, V, hidden, half, sel_stride, SPLIT,
              K: tl.constexpr, ACT: tl.constexpr, INDEXED: tl.constexpr, DEPTH2: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """Program (r * M + m, split) handles row blocks split, split + SPLIT, ...; writes dx for its
    rows and its share of the parameter gradients."""
    rm = tl.program_id(0)
    split = tl.program_id(1)
    r, m = rm // M, rm % M
    hh = tl.arange(0, BLOCK_H)
    kk = tl.arange(0, BLOCK_K)
    w1, b1, w2, skip = _params(w1_ptr, b1_ptr, w2_ptr, skip_ptr, rm, hidden, K, BLOCK_H, BLOCK_K)
    live_h = (hh < hidden)[None, :]
    dw1 = tl.zeros((BLOCK_H, BLOCK_K), tl.float32)
    db1 = tl.zeros((BLOCK_H,), tl.float32)
    dw2 = tl.zeros((BLOCK_H,), tl.float32)
    dskip = tl.zeros((BLOCK_K,), tl.float32)
    db2 = tl.zeros((BLOCK_R,), tl.float32)
    dwmid = tl.zeros((BLOCK_H, BLOCK_H), tl.float32)
    dbmid = tl.zeros((BLOCK_H,), tl.float32)
    if DEPTH2:
        wmid, bmid = _load_mid(wmid_ptr, bmid_ptr, rm, hidden, BLOCK_H)
    for start in range(split * BLOCK_R, n_rows, SPLIT * BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        row_ok = rows < n_rows
        x = _inputs(stream_ptr, sel_ptr + r * sel_stride, r, m, rows, n_rows, V, K, INDEXED,
                    BLOCK_K, BLOCK_V)
        h = tl.sum(x[:, None, :] * w1[None, :, :], axis=2) + b1[None, :]
        a, da = _act(h, hh, half, ACT)
        a = tl.where(live_h, a, 0.0)
        dy = tl.load(dy_ptr + (r * n_rows + rows) * M + m, mask=row_ok, other=0.0)               # (BR,)
        db2 += dy
        dskip += tl.sum(x * dy[:, None], axis=0)
        if DEPTH2:
            a2, da2 = _act(tl.dot(a, tl.trans(wmid), input_precision="ieee") + bmid[None, :], hh, half, ACT)
            a2 = tl.where(live_h, a2, 0.0)
            dw2 += tl.sum(a2 * dy[:, None], axis=0)
            dh2 = tl.where(live_h, dy[:, None] * w2[None, :] * da2, 0.0)                          # (BR, BH)
            dwmid += tl.dot(tl.trans(dh2), a, input_precision="ieee")                            # [g, h]
            dbmid += tl.sum(dh2, axis=0)
            dh = tl.where(live_h, tl.dot(dh2, wmid, input_precision="ieee") * da, 0.0)
        else:
            dw2 += tl.sum(a * dy[:, None], axis=0)
            dh = tl.where(live_h, dy[:, None] * w2[None, :] * da, 0.0)                            # (BR, BH)
        dw1 += tl.sum(dh[:, :, None] * x[:, None, :], axis=0)
        db1 += tl.sum(dh, axis=0)
        dx = tl.sum(dh[:, :, None] * w1[None, :, :], axis=1) + dy[:, None] * skip[None, :]        # (BR, BK)
        tl.store(dx_ptr + (r * n_rows + rows[:, None]) * (M * K) + m * K + kk[None, :], dx,
                 mask=row_ok[:, None] & (kk < K)[None, :])
    part = rm * SPLIT + split
    tl.store(dw1_ptr + part * hidden * K + hh[:, None] * K + kk[None, :], dw1,
             mask=(hh < hidden)[:, None] & (kk < K)[None, :])
    tl.store(db1_ptr + part * hidden + hh, db1, mask=hh < hidden)
    if DEPTH2:
        tl.store(dwmid_ptr + part * hidden * hidden + hh[:, None] * hidden + hh[None, :], dwmid,
                 mask=(hh < hidden)[:, None] & (hh < hidden)[None, :])
        tl.store(dbmid_ptr + part * hidden + hh, dbmid, mask=hh < hidden)
    tl.store(dw2_ptr + part * hidden + hh, dw2, mask=hh < hidden)
    tl.store(dskip_ptr + part * K + kk, dskip, mask=kk < K)
    tl.store(db2_ptr + part, tl.sum(db2, axis=0))


BLOCK_R = 32
MAX_SPLIT = 64   # row splits per sub-MLP in the backward: enough programs, few partial sums


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous()


class _MLPBank(torch.autograd.Function):
    @staticmethod
    def forward(ctx, stream, select, W1, b1, W_mid, b_mid, W2, b2, skip, activation):
        R, n_rows, V = stream.shape
        _, M, hidden, K = W1.shape
        indexed = not select.dtype.is_floating_point
        depth2 = W_mid is not None
        sel = select.to(torch.int32).contiguous() if indexed else _f32(select)
        mid = [_f32(W_mid), _f32(b_mid)] if depth2 else [W1.new_zeros(1, dtype=torch.float32)] * 2
        args = [_f32(stream), sel, _f32(W1), _f32(b1), *mid] + [_f32(t) for t in (W2, b2, skip)]
        y = output((R, n_rows, M), stream)
        # tl.dot (second hidden layer) needs >= 16 lanes; padded units are masked
        blocks = dict(BLOCK_R=BLOCK_R, BLOCK_H=max(16, triton.next_power_of_2(hidden)),
                      BLOCK_K=triton.next_power_of_2(K), BLOCK_V=triton.next_power_of_2(V))
        meta = dict(K=K, ACT=ACTIVATIONS[activation], INDEXED=indexed, DEPTH2=depth2, **blocks)
        if n_rows:
            _bank_fwd[(R * M, triton.cdiv(n_rows, BLOCK_R))](*args, y, M, n_rows, V, hidden, hidden // 2,
                                                              sel[0].numel(), **meta)
        ctx.save_for_backward(*args)
        ctx.meta, ctx.dtypes = meta, (stream.dtype, select.dtype)
        return y.to(stream.dtype)

    @staticmethod
    def backward(ctx, dy):
        stream, sel, W1, b1, W_mid, b_mid, W2, b2, skip = ctx.saved_tensors
        R, n_rows, V = stream.shape
        _, M, hidden, K = W1.shape
        depth2 = ctx.meta["DEPTH2"]
        split = max(1, min(MAX_SPLIT, triton.cdiv(n_rows, BLOCK_R)))
        dx = output((R, n_rows, M * K), stream)
        parts = R * M * split
        dw1, db1, dw2 = output((parts, hidden, K), stream), output((parts, hidden), stream), output((parts, hidden), stream)
        db2, dskip = output((parts,), stream), output((parts, K), stream)
        dwmid, dbmid = (output((parts, hidden, hidden), stream), output((parts, hidden), stream)) if depth2 else (dx, dx)
        _bank_bwd[(R * M, split)](stream, sel, W1, b1, W_mid, b_mid, W2, skip, _f32(dy), dx,
                                  dw1, db1, dwmid, dbmid, dw2, db2, dskip,
                                  M, n_rows, V, hidden, hidden // 2, sel[0].numel(), split, **ctx.meta)
        if ctx.meta["INDEXED"]:   # gather -> scatter-add of the input gradients into their columns
            dstream = torch.zeros_like(stream).scatter_add_(-1, sel.long()[:, None, :].expand(-1, n_rows, -1), dx)
            dsel = None
        else:
            dstream = torch.bmm(dx, sel)                          # (R, rows, M*k) @ (R, M*k, V)
            dsel = split_product(dx, stream)                      # (R, M*k, rows) @ (R, rows, V), split
        sum_parts = lambda t: t.view(R, M, split, *t.shape[1:]).sum(2)   # noqa: E731
        stream_dtype, sel_dtype = ctx.dtypes
        mid = (sum_parts(dwmid), sum_parts(dbmid)) if depth2 else (None, None)
        return (dstream.to(stream_dtype), None if dsel is None else dsel.to(sel_dtype),
                sum_parts(dw1), sum_parts(db1), *mid, sum_parts(dw2), sum_parts(db2), sum_parts(dskip), None)


def mlp_bank(stream: torch.Tensor, select: torch.Tensor, W1, b1, W2, b2, skip, activation: str,
             W_mid=None, b_mid=None) -> torch.Tensor:
    """stream (R, rows, V); select: weights (R, M*k, V) or int indices (R, M*k); W1 (R, M, hidden, k),
    b1 (R, M, hidden), W2 (R, M, hidden), b2 (R, M), skip (R, M, k); optional second hidden layer
    W_mid (R, M, hidden, hidden) as [to, from], b_mid (R, M, hidden) -> outputs (R, rows, M).

    Same values and gradients as SubMLPs.evaluate(Choice(...).read(stream)) in wtc.dt.submlp.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"mlp_bank: activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    R, n_rows, V = stream.shape
    if W1.ndim != 4 or W1.shape[0] != R:
        raise ValueError(f"mlp_bank: W1 must be (R={R}, M, hidden, k), got {tuple(W1.shape)}")
    _, M, hidden, K = W1.shape
    expected = (R, M * K) if not select.dtype.is_floating_point else (R, M * K, V)
    if tuple(select.shape) != expected:
        raise ValueError(f"mlp_bank: select must be {expected} (weights) or {(R, M * K)} (indices), "
                         f"got {tuple(select.shape)}")
    if (W_mid is None) != (b_mid is None) or (W_mid is not None and tuple(W_mid.shape) != (R, M, hidden, hidden)):
        raise ValueError(f"mlp_bank: W_mid must be {(R, M, hidden, hidden)} together with b_mid, got "
                         f"{None if W_mid is None else tuple(W_mid.shape)} and {None if b_mid is None else tuple(b_mid.shape)}")
    return _MLPBank.apply(stream, select, W1, b1, W_mid, b_mid, W2, b2, skip, activation)
