"""Products whose weight gradient has a huge inner dimension, split for the GPU.

    read_product(values, weights)   values (R, ..., V), weights (R, S, V) -> (R, ..., S)
    split_product(a, b)             a (R, M, S), b (R, M, V) -> a^T b (R, S, V)

A soft selection read (wtc.dt.selection.Choice.read), the DT's linear head and the sub-MLP bank's
selection gradient all need sum_m a[r, m, s] b[r, m, v]: a tiny output (S x V) over a huge inner
dimension (M = batch x positions, ~10^5 in training). cuBLAS runs such a product as one tile per
replica looping over M: 1.5 ms a call on an H200 at batch 4096, half of a DT training step's device
time (bench/gpu_profile.py, session 22). Split over M into partial products of SPLIT_ROWS rows (a
batch of small GEMMs that fills the GPU), then summed: the same result to float32 rounding. CPU
tensors keep the plain product (the CPU BLAS blocks the inner dimension itself, and CPU training
stays bit-for-bit what it was).
"""
from __future__ import annotations

import torch

SPLIT_ROWS = 4096   # rows per partial product


def split_product(a: torch.Tensor, b: torch.Tensor, rows: int = SPLIT_ROWS) -> torch.Tensor:
    """a (R, M, S), b (R, M, V) -> a^T b (R, S, V), summed over M in chunks of `rows` rows."""
    R, M, S = a.shape
    V = b.shape[-1]
    if not a.is_cuda:
        return torch.bmm(a.transpose(1, 2), b)
    chunks = M // rows
    out = a.new_zeros(R, S, V)
    if chunks > 1:
        head = chunks * rows
        pa = a[:, :head].reshape(R * chunks, rows, S)
        pb = b[:, :head].reshape(R * chunks, rows, V)
        out += torch.bmm(pa.transpose(1, 2), pb).view(R, chunks, S, V).sum(1)
        a, b = a[:, head:], b[:, head:]
    if a.shape[1]:
        out += torch.bmm(a.transpose(1, 2), b)
    return out


class _ReadProduct(torch.autograd.Function):
    """values (R, M, V) @ weights (R, S, V)^T -> (R, M, S); the weights' gradient by split_product."""

    @staticmethod
    def forward(ctx, values, weights):
        ctx.save_for_backward(values, weights)
        return torch.bmm(values, weights.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad):
        values, weights = ctx.saved_tensors
        d_values = torch.bmm(grad, weights) if ctx.needs_input_grad[0] else None
        d_weights = split_product(grad, values) if ctx.needs_input_grad[1] else None
        return d_values, d_weights


def read_product(values: torch.Tensor, weights: torch.Tensor, split: bool | None = None) -> torch.Tensor:
    """values (R, ..., V), weights (R, S, V) -> (R, ..., S) = sum_v values[..., v] weights[s, v].

    split (default: for CUDA tensors): the weights' gradient by split_product; otherwise einsum."""
    if split is None:
        split = values.is_cuda
    if not split:
        return torch.einsum("r...v,rsv->r...s", values, weights)
    R, V = values.shape[0], values.shape[-1]
    return _ReadProduct.apply(values.reshape(R, -1, V), weights).view(*values.shape[:-1], weights.shape[1])
