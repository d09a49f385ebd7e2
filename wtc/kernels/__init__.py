"""Triton kernels: the Discrete Transformer's hot path (below) and the scan's KL (wtc.kernels.kl).

    route(...)      fused pointer-head routing: PLE, bilinear score, causal mask, Gumbel noise,
                    temperature softmax (online, over key blocks) and routing, forward + backward
    aggregate(...)  aggregate heads: causal running mean
    mlp_bank(...)   all sub-MLPs of a layer in one launch: gather k inputs, hidden layer, output

Each op lives in its own file (kernels, launcher, autograd.Function); the torch reference in wtc.dt
is the complete CPU path and the oracle the tests compare against. wtc.kernels.cpu holds the CPU
twins of route and mlp_bank (C++/OpenMP in wtc._C, csrc/dt_route.cpp and csrc/dt_mlp.cpp), chosen for
float32 CPU tensors when wtc._C is built. Whether an op runs here is
wtc.backend.choose's decision (ops "dt.route", "dt.mlp_bank", "scan.kl_rows", "scan.kl_rank1").
Nothing here imports triton until an op runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from wtc.kernels.buffers import output

if TYPE_CHECKING:
    import torch

__all__ = ["output", "route", "aggregate", "mlp_bank"]


def route(*args, **kwargs):
    """Fused pointer-head routing; see wtc/kernels/routing.py."""
    from wtc.kernels.routing import route as op
    return op(*args, **kwargs)


def aggregate(val: torch.Tensor) -> torch.Tensor:
    """Aggregate heads (..., T) -> causal running mean; see wtc/kernels/routing.py."""
    from wtc.kernels.routing import aggregate as op
    return op(val)


def mlp_bank(*args, **kwargs):
    """All sub-MLPs of a layer in one launch; see wtc/kernels/submlps.py."""
    from wtc.kernels.submlps import mlp_bank as op
    return op(*args, **kwargs)
