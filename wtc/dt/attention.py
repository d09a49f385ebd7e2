"""Numerical attention: heads that only route a scalar from one position to another.

Pointer head h (paper: PLE-scored, temperature-annealed hard attention) scores query position i
against key position j as

    score(i, j) = exp(c) * (PLE(q_i)^T W PLE(k_j) + u . PLE(k_j) + rel[i - j] + abs[j])

q, k, v are stream variables chosen by annealed selections. The content term is the paper's; the
key-only term u lets a head prefer large or small keys whatever the query (windowed extrema); rel
and abs are positional scores tied across positions (one parameter per offset / per key
position): with a free PLE(pos_i)^T W PLE(pos_j) every position pair has its own parameter and
heads learn different offsets at different positions (DT-NOTES). Keys include `pad` virtual
positions before the start, where every variable is 0, so an offset-d pointer is the same rule at
every query. Softmax over keys with Gumbel noise at temperature tau -> argmax pointer as tau -> 0.

Aggregate heads (beyond the paper) output the uniform mean of a chosen variable over the causal
prefix of real positions: running sums, counts and means become reachable.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from wtc import _native
from wtc.dt.hooks import HookPoint
from wtc.dt.ple import ple_uniform
from wtc.dt.select import Choice, Sampling, Selector, entropy, gumbel_like, relaxed_one_hot


class Attention(nn.Module):
    """One layer's pointer heads (H) and aggregate heads (A) for R replicas."""

    def __init__(self, layer: int, replicas: int, n_heads: int, n_agg: int, n_bins: int,
                 seq_len: int, pad: int, variable_names: list[str], mask_fn, content: torch.Tensor,
                 offset_prior: float = 1.0):
        super().__init__()
        R, H, A, N = replicas, n_heads, n_agg, n_bins
        self.layer, self.H, self.A, self.T, self.P = layer, H, A, seq_len, pad
        L = pad + seq_len
        self.head_names = [f"L{layer}.h{h}" for h in range(H)]
        self.agg_names = [f"L{layer}.a{a}" for a in range(A)]
        slots = ([f"{n}.q" for n in self.head_names] + [f"{n}.k" for n in self.head_names]
                 + [f"{n}.v" for n in self.head_names] + [f"{n}.v" for n in self.agg_names])
        self.select = Selector(R, slots, variable_names, mask_fn(slots, variable_names))
        # content scores start neutral: a head routes by position unless content pays off
        self.W = nn.Parameter(torch.zeros(R, H, N, N))
        self.u = nn.Parameter(torch.zeros(R, H, N))
        # offsets 0 .. L-1; each head starts preferring a different small offset (1, 2, 3, ... rotated
        # across replicas; DTConfig.offset_prior): identical heads all lock onto the offset with the
        # strongest signal (seen: every head at t-2 on x_t x_{t-1} + x_{t-2}, a product left unfound)
        rel = 0.1 * torch.randn(R, H, L)
        spread = max(1, min(H, L - 1))
        for r in range(R):
            for h in range(H):
                rel[r, h, 1 + (h + r) % spread if L > 1 else 0] += offset_prior
        self.rel = nn.Parameter(rel)
        self.abs = nn.Parameter(0.1 * torch.randn(R, H, L))   # key positions (pads first)
        # one log-scale per head: under Adam a single scalar can sharpen a head quickly, where
        # growing every score entry takes many steps (pointers must beat the Gumbel noise)
        self.log_scale = nn.Parameter(torch.zeros(R, H))
        # (R,) 1 where the replica's heads may score content (q, k); 0 = positional pointers only
        self.register_buffer("content", content.float().clone())
        i = torch.arange(seq_len)[:, None] + pad
        j = torch.arange(L)[None, :]
        self.register_buffer("offset", (i - j).clamp(min=0), persistent=False)   # (T, L)
        self.register_buffer("causal", j <= i, persistent=False)                 # (T, L)
        self.hook_scores = HookPoint()    # (R, B, H, T, L)
        self.hook_pattern = HookPoint()   # (R, B, H, T, L)
        self.hook_z = HookPoint()         # (R, B, H + A, T): routed values
        self.pinned: torch.Tensor | None = None   # (R, B, H, T) key indices, see DiscreteTransformer.pinned_pointers

    @property
    def output_names(self) -> list[str]:
        return self.head_names + self.agg_names

    def scores(self, unit: torch.Tensor, choice: Choice) -> torch.Tensor:
        """unit (R, B, L, V) every variable scaled to [0, 1] by its range -> scores (R, B, H, T, L).

        Soft selections mix the scaled values, then encode (PLE of the mixture): once the choice
        is one-hot this is exactly PLE of the chosen variable with uniform bins over its range.
        """
        H, P, N = self.H, self.P, self.W.shape[-1]
        zq = choice.read(unit[:, :, P:], slice(0, H)).transpose(2, 3)        # (R, B, H, T)
        zk = choice.read(unit, slice(H, 2 * H)).transpose(2, 3)              # (R, B, H, L)
        enc_q, enc_k = ple_uniform(zq, N), ple_uniform(zk, N)                # (..., N)
        proj = enc_q @ self.W[:, None] + self.u[:, None, :, None, :]         # (R, B, H, T, N)
        s = (proj @ enc_k.transpose(-1, -2)) * self.content[:, None, None, None, None]   # (R, B, H, T, L)
        s = s + self.rel[:, None, :, self.offset] + self.abs[:, None, :, None, :]
        s = s * self.log_scale.exp()[:, None, :, None, None]
        return s.masked_fill(~self.causal, float("-inf"))

    def forward(self, stream: torch.Tensor, unit: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, dict]:
        """stream (R, B, L, V) in model units and `unit`, the same scaled to [0, 1] per variable
        -> outputs (R, B, H + A, T), stats."""
        H, A, P = self.H, self.A, self.P
        choice = self.select(sampling)
        outs, stats = [], {}
        if H:
            if self.pinned is not None:
                val = choice.read(stream, slice(2 * H, 3 * H)).transpose(2, 3)   # (R, B, H, L)
                outs.append(val.gather(-1, self.pinned))
            elif sampling.native and self.select.frozen and not stream.is_cuda:
                outs.append(self._route_native(stream, unit))
            else:
                s = self.hook_scores(self.scores(unit, choice))
                attn = self._attend(s, sampling)
                if sampling.stats:  # training log: how far heads are from hard pointers
                    stats["attn_entropy"] = entropy(torch.softmax(s.detach() / sampling.tau, -1)).mean(dim=(1, 3))
                attn = self.hook_pattern(attn)
                if sampling.noise and H > 1 and choice.weights is not None:
                    stats["redundancy"] = self.redundancy(attn, choice.weights[:, 2 * H:3 * H])
                val = choice.read(stream, slice(2 * H, 3 * H)).transpose(2, 3)   # (R, B, H, L)
                outs.append((attn @ val.unsqueeze(-1)).squeeze(-1))             # (R, B, H, T)
        if A:
            val = choice.read(stream[:, :, P:], slice(3 * H, None)).transpose(2, 3)  # (R, B, A, T)
            count = torch.arange(1, self.T + 1, dtype=val.dtype, device=val.device)
            outs.append(val.cumsum(-1) / count)
        return self.hook_z(torch.cat(outs, dim=2)), stats

    @staticmethod
    def redundancy(attn: torch.Tensor, value_sel: torch.Tensor) -> torch.Tensor:
        """(R,) how much pairs of heads route the same variable from the same keys.

        attn (R, B, H, T, L), value_sel (R, H, V). Two heads with one pointer and one value variable
        are one head: a penalty on this overlap keeps heads from collapsing onto the offset with the
        strongest signal (seen: every head at t-2 on x_t x_{t-1} + x_{t-2}).
        """
        B, H, T = attn.shape[1], attn.shape[2], attn.shape[3]
        overlap = torch.einsum("rbhtl,rbgtl->rhg", attn, attn) / (B * T)           # (R, H, H)
        same_value = torch.einsum("rhv,rgv->rhg", value_sel, value_sel)
        pairs = torch.triu(torch.ones(H, H, dtype=attn.dtype, device=attn.device), diagonal=1)
        return (overlap * same_value * pairs).sum(dim=(1, 2))

    def _attend(self, s: torch.Tensor, sampling: Sampling) -> torch.Tensor:
        noise = gumbel_like(s, sampling.generator) if sampling.noise else None
        if noise is not None:
            noise = noise.masked_fill(~self.causal, 0.0)
        return relaxed_one_hot(s, sampling.tau, hard=sampling.hard, noise=noise,
                               straight_through=sampling.straight_through)

    @torch.no_grad()
    def _route_native(self, stream: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
        """Argmax routing of the frozen heads through wtc._C (same result as the torch path)."""
        R, B, L, V = stream.shape
        H, P, N = self.H, self.P, self.W.shape[-1]
        idx = self.select.index()                                             # (R, S)

        def pick(values, ix):  # (R, B, L, V), (R, H) -> (R*H, B, L)
            return torch.stack([values[r][:, :, ix[r]].permute(2, 0, 1) for r in range(R)]).reshape(R * H, B, L)

        def f32(t):
            return np.ascontiguousarray(t.detach().float().cpu().numpy())

        bins = f32(torch.linspace(0, 1, N + 1).expand(R * H, -1))
        on = self.content[:, None, None]
        _, value, _ = _native.cpu_module().route_hard(
            f32(pick(unit, idx[:, :H])[:, :, P:]), f32(pick(unit, idx[:, H:2 * H])),
            f32(pick(stream, idx[:, 2 * H:3 * H])), bins, bins,
            f32((self.W * on[..., None]).reshape(R * H, N, N)), f32((self.u * on).reshape(R * H, N)),
            f32(self.rel.reshape(R * H, -1)), f32(self.abs.reshape(R * H, -1)), P)
        # (the positive per-head scale exp(c) does not change an argmax, so the kernel skips it)
        return torch.from_numpy(value).to(stream.dtype).reshape(R, H, B, self.T).permute(0, 2, 1, 3)
