"""Piecewise Linear Encoding (Gorishniy, Rubachev, Babenko 2022) — the torch reference.

Bins b_0 < ... < b_n give n components; component t is (x - b_t) / (b_{t+1} - b_t) clipped to
[0, 1], except that the first is not floored and the last is not capped (linear extrapolation).
Inside bin t the code is [1, .., 1, frac, 0, .., 0]. The native twin lives inside wtc._C.route_hard.
"""
from __future__ import annotations

import torch


def ple(x: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """x (...), bins (..., n+1) broadcastable against x[..., None] -> (..., n)."""
    lo, hi = bins[..., :-1], bins[..., 1:]
    c = (x.unsqueeze(-1) - lo) / (hi - lo)
    n = c.shape[-1]
    if n == 1:
        return c
    # clamp the interior fully, the first component only from above, the last only from below
    first = c[..., :1].clamp(max=1.0)
    mid = c[..., 1:-1].clamp(0.0, 1.0)
    last = c[..., -1:].clamp(min=0.0)
    return torch.cat([first, mid, last], dim=-1)


def uniform_bins(lo: torch.Tensor, hi: torch.Tensor, n: int) -> torch.Tensor:
    """n equal-width bins between lo and hi (any shape) -> (..., n+1); a degenerate range is widened."""
    span = (hi - lo).clamp(min=1e-6)
    steps = torch.linspace(0.0, 1.0, n + 1, dtype=lo.dtype, device=lo.device)
    return lo.unsqueeze(-1) + span.unsqueeze(-1) * steps


def ple_uniform(z: torch.Tensor, n: int) -> torch.Tensor:
    """PLE of z (...) with n equal bins on [0, 1] -> (..., n); equals ple(z, linspace(0, 1, n + 1)).

    Component t = clip(n z - t, 0, 1) (first not floored, last not capped): one fused expression
    instead of per-bin edges, since every variable is scaled to [0, 1] by its own range first.
    """
    t = torch.arange(n, dtype=z.dtype, device=z.device)
    c = z.unsqueeze(-1) * n - t
    if n == 1:
        return c
    # masked_fill, not lo[0] = -inf: item assignment copies a host scalar to the device, which a CUDA
    # graph capture refuses (wtc.dt.graph_step)
    lo = torch.zeros_like(t).masked_fill(t == 0, float("-inf"))
    hi = torch.ones_like(t).masked_fill(t == n - 1, float("inf"))
    return torch.clamp(c, lo, hi)
