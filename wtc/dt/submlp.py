"""Numerical MLP: a bank of independent sub-MLPs, each an operator on k chosen stream variables.

Sub-MLP m reads k variables (annealed selections, one per input slot), maps them through one
hidden layer plus a linear skip to one scalar that is appended to the stream. With mlp_activation='relu+silu' half of
the hidden units are ReLU (exact kinks: max, min, relu) and half SiLU (smooth: products, squares).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wtc import kernels
from wtc.dt.hooks import HookPoint
from wtc.dt.select import Sampling, Selector

_ACT = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu, "tanh": torch.tanh}


def activate(h: torch.Tensor, activation: str) -> torch.Tensor:
    """Hidden activations (..., hidden); 'relu+silu': the first half ReLU, the rest SiLU."""
    if activation != "relu+silu":
        return _ACT[activation](h)
    half = h.shape[-1] // 2
    return torch.cat([F.relu(h[..., :half]), F.silu(h[..., half:])], dim=-1)


class SubMLPs(nn.Module):
    """M sub-MLPs with k inputs and `hidden` units each, for R replicas."""

    def __init__(self, layer: int, replicas: int, n_mlps: int, k: int, hidden: int, activation: str,
                 variable_names: list[str], mask_fn):
        super().__init__()
        R, M = replicas, n_mlps
        self.layer, self.M, self.k, self.activation = layer, n_mlps, k, activation
        self.names = [f"L{layer}.m{m}" for m in range(M)]
        slots = [f"{n}.in{i}" for n in self.names for i in range(k)]   # slot m*k + i
        self.select = Selector(R, slots, variable_names, mask_fn(slots, variable_names))
        w1 = torch.randn(R, M, hidden, k) * (2.0 / k) ** 0.5
        centre = torch.rand(R, M, hidden, k)          # put each unit's kink inside the [0, 1] cube
        self.W1 = nn.Parameter(w1)
        self.b1 = nn.Parameter(-(w1 * centre).sum(-1))
        self.W2 = nn.Parameter(torch.randn(R, M, hidden) * (0.5 / hidden ** 0.5))
        self.b2 = nn.Parameter(torch.zeros(R, M))
        self.skip = nn.Parameter(torch.zeros(R, M, k))   # affine part: linear functions stay exact
        self.hook_pre = HookPoint()    # (R, B, T, M, k): each sub-MLP's inputs
        self.hook_post = HookPoint()   # (R, B, T, M): each sub-MLP's output

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return activate(h, self.activation)

    def evaluate(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs (R, ..., M, k) -> outputs (R, ..., M); the sub-MLPs as plain functions."""
        shape = inputs.shape
        x = inputs.reshape(shape[0], -1, self.M, self.k)                      # (R, N, M, k)
        h = self.act(torch.einsum("rnmk,rmhk->rnmh", x, self.W1) + self.b1[:, None])
        y = torch.einsum("rnmh,rmh->rnm", h, self.W2) + self.b2[:, None] + (x * self.skip[:, None]).sum(-1)
        return y.reshape(shape[:-1])

    def forward(self, stream: torch.Tensor, sampling: Sampling) -> torch.Tensor:
        """stream (R, B, T, V) at real positions -> outputs (R, B, T, M)."""
        choice = self.select(sampling)
        if kernels.use_triton(stream) and not self.hook_pre._forward_hooks:   # fused: inputs never stored
            R, B, T, V = stream.shape
            select = choice.index if choice.index is not None else choice.weights
            y = kernels.mlp_bank(stream.reshape(R, B * T, V), select, self.W1, self.b1, self.W2, self.b2,
                                 self.skip, self.activation)
            return self.hook_post(y.view(R, B, T, self.M))
        inputs = choice.read(stream)                                           # (R, B, T, M*k)
        inputs = self.hook_pre(inputs.unflatten(-1, (self.M, self.k)))
        return self.hook_post(self.evaluate(inputs))
