"""Numerical MLP: a bank of independent sub-MLPs, each an operator on k chosen stream variables.

Sub-MLP m reads k variables (annealed selections, one per input slot), maps them through one
hidden layer (two with depth=2) plus a linear skip to one scalar that is appended to the stream.
One hidden layer represents max(a, b) = a + relu(b - a) exactly but not max(a, b, c), which needs
a ReLU of a ReLU; depth 2 does (a depth-1 fit of max of three integers in [0, 100) stays 5-7 off,
depth 2 within 0.25-0.41: measured by a direct L-BFGS fit, see bench/RESULTS.md). With mlp_activation='relu+silu' half of
the hidden units are ReLU (exact kinks: max, min, relu) and half SiLU (smooth: products, squares).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wtc import kernels
from wtc.kernels import cpu as cpu_kernels
from wtc.backend import choose
from wtc.dt.selection import Sampling, Selector
from wtc.hooks import HookPoint

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
                 variable_names: list[str], mask_fn, depth: int = 1):
        super().__init__()
        R, M = replicas, n_mlps
        self.layer, self.M, self.k, self.activation, self.depth = layer, n_mlps, k, activation, depth
        self.names = [f"L{layer}.m{m}" for m in range(M)]
        slots = [f"{n}.in{i}" for n in self.names for i in range(k)]   # slot m*k + i
        self.select = Selector(R, slots, variable_names, mask_fn(slots, variable_names))
        w1 = torch.randn(R, M, hidden, k) * (2.0 / k) ** 0.5
        centre = torch.rand(R, M, hidden, k)          # put each unit's kink inside the [0, 1] cube
        self.W1 = nn.Parameter(w1)
        self.b1 = nn.Parameter(-(w1 * centre).sum(-1))
        if depth == 2:   # second hidden layer, He-scaled, started as a near pass-through of the first
            self.W_mid = nn.Parameter(torch.eye(hidden).expand(R, M, -1, -1) + torch.randn(R, M, hidden, hidden)
                                      * (0.5 / hidden ** 0.5))
            self.b_mid = nn.Parameter(torch.zeros(R, M, hidden))
        elif depth != 1:
            raise ValueError(f"sub-MLP depth must be 1 or 2, got {depth}")
        self.W2 = nn.Parameter(torch.randn(R, M, hidden) * (0.5 / hidden ** 0.5))
        self.b2 = nn.Parameter(torch.zeros(R, M))
        self.skip = nn.Parameter(torch.zeros(R, M, k))   # affine part: linear functions stay exact
        self.hook_pre = HookPoint()    # (R, B, T, M, k): each sub-MLP's inputs
        self.hook_post = HookPoint()   # (R, B, T, M): each sub-MLP's output

    def parameters_of_map(self) -> list[nn.Parameter]:
        """The continuous parameters of the sub-MLP functions (not the selections)."""
        mid = [self.W_mid, self.b_mid] if self.depth == 2 else []
        return [self.W1, self.b1, *mid, self.W2, self.b2, self.skip]

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return activate(h, self.activation)

    def evaluate(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs (R, ..., M, k) -> outputs (R, ..., M); the sub-MLPs as plain functions."""
        shape = inputs.shape
        x = inputs.reshape(shape[0], -1, self.M, self.k)                      # (R, N, M, k)
        h = self.act(torch.einsum("rnmk,rmhk->rnmh", x, self.W1) + self.b1[:, None])
        if self.depth == 2:
            h = self.act(torch.einsum("rnmh,rmgh->rnmg", h, self.W_mid) + self.b_mid[:, None])
        y = torch.einsum("rnmh,rmh->rnm", h, self.W2) + self.b2[:, None] + (x * self.skip[:, None]).sum(-1)
        return y.reshape(shape[:-1])

    def forward(self, stream: torch.Tensor, sampling: Sampling) -> torch.Tensor:
        """stream (R, B, T, V) at real positions -> outputs (R, B, T, M)."""
        choice = self.select(sampling)
        backend = choose("dt.mlp_bank", stream)
        if backend == "triton" and not self.hook_pre.has_hooks:   # fused: inputs never stored
            R, B, T, V = stream.shape
            select = choice.index if choice.index is not None else choice.weights
            mid = dict(W_mid=self.W_mid, b_mid=self.b_mid) if self.depth == 2 else {}
            y = kernels.mlp_bank(stream.reshape(R, B * T, V), select, self.W1, self.b1, self.W2, self.b2,
                                 self.skip, self.activation, **mid)
            return self.hook_post(y.view(R, B, T, self.M))
        inputs = choice.read(stream)                                           # (R, B, T, M*k)
        inputs = self.hook_pre(inputs.unflatten(-1, (self.M, self.k)))
        if backend == "native":   # the same function, fused on the CPU (hidden layers never stored)
            mid = dict(W_mid=self.W_mid, b_mid=self.b_mid) if self.depth == 2 else {}
            return self.hook_post(cpu_kernels.mlp_bank(inputs, self.W1, self.b1, self.W2, self.b2, self.skip,
                                                       self.activation, **mid))
        return self.hook_post(self.evaluate(inputs))
