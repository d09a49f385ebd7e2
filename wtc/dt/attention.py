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

Recency heads (beyond the paper; DTConfig.n_recent_heads: the last heads of a layer) pick the
LATEST key whose value scores best: their positional term is not free but tied to a descending ramp,
rel[d] = -RECENCY_SLOPE * d for offsets d >= 1, their abs term is 0 (but at the pads: where they go
when no key qualifies) and their query term W is 0, so
the argmax is "the key with the best u . PLE(k), ties to the most recent". With u two-levelled this
is "the latest j where pred(k_j)" (a carry: the latest position whose digit sum is not base - 1; the
last value seen; the last non-zero). rel[0] stays learned: very negative it excludes the query's
own position (j < t), otherwise j <= t. The effective parameters are computed here
(Attention.score_params) and passed to the same routing kernels as every other head; they score
content in every replica (the query-only terms of the other heads stay off where content is).

Aggregate heads (beyond the paper; DTConfig.n_agg_heads, agg_ops) write a statistic of one variable
over the causal prefix instead of routing: its mean, its sum (written / T), a periodic weighted sum
(wtc.dt.periodic), or its max / min (prefix_extremes: "P held at some / every j <= t" of an
indicator a sub-MLP computes, in the variable's own units).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from wtc import _native, kernels
from wtc.kernels import cpu as cpu_kernels
from wtc.backend import choose
from wtc.dt.config import EXTREME_OPS
from wtc.dt.gumbel import draw_seed, gumbel_hash
from wtc.dt.periodic import PeriodicAggregates, period_of
from wtc.dt.ple import ple_uniform
from wtc.dt.selection import Choice, Sampling, Selector, entropy, relaxed_one_hot
from wtc.hooks import HookPoint


# ---------------------------------------------------------------- the reference ops (CPU path and oracle)
def pointer_scores(zq, zk, W, u, rel, abs_, scale, content, pad: int) -> torch.Tensor:
    """Pointer-head scores, materialised: (R, B, H, T, L), -inf above the causal limit j <= i + pad.

    zq (R, B, H, T) and zk (R, B, H, L) on [0, 1]; W (R, H, N, N), u (R, H, N); rel, abs_ (R, H, L)
    per offset i + pad - j and per key position; scale (R, H) > 0; content (R,) 0/1.
    """
    T, L = zq.shape[-1], zk.shape[-1]
    s = content_scores(zq, zk, W, u, content)                            # (R, B, H, T, L)
    i = torch.arange(T, device=zq.device)[:, None] + pad
    j = torch.arange(L, device=zq.device)[None, :]
    s = s + rel[:, None][..., (i - j).clamp(min=0)] + abs_[:, None, :, None, :]
    s = s * scale[:, None, :, None, None]
    return s.masked_fill(j > i, float("-inf"))


def content_scores(zq, zk, W, u, content) -> torch.Tensor:
    """content * (PLE(zq) W + u) . PLE(zk): (R, B, H, T, L), computed only for the replicas with
    content != 0 (position-only replicas get exact zeros, what 0 * score was): the encodings and
    bilinear products of the others would be thrown away."""
    N = W.shape[-1]
    if zq.is_cuda and torch.cuda.is_current_stream_capturing():
        # a CUDA graph capture cannot read which replicas are on (wtc.dt.graph_step): score every
        # replica and zero the position-only ones, the same values
        enc_q, enc_k = ple_uniform(zq, N), ple_uniform(zk, N)
        proj = enc_q @ W[:, None] + u[:, None, :, None, :]
        return (proj @ enc_k.transpose(-1, -2)) * content[:, None, None, None, None]
    on = torch.nonzero(content).squeeze(1)
    every = on.numel() == content.numel()
    if not every:
        zq, zk, W, u = zq[on], zk[on], W[on], u[on]
    enc_q, enc_k = ple_uniform(zq, N), ple_uniform(zk, N)                # (R', B, H, T|L, N)
    proj = enc_q @ W[:, None] + u[:, None, :, None, :]                   # (R', B, H, T, N)
    s = (proj @ enc_k.transpose(-1, -2)) * content[on][:, None, None, None, None]
    if every:
        return s
    full = s.new_zeros((content.numel(), *s.shape[1:]))
    return full.index_copy(0, on, s)


def relax(s: torch.Tensor, sampling: Sampling, seed: int | None) -> torch.Tensor:
    """Scores (R, B, H, T, L) -> attention pattern: Gumbel noise from `seed` (None: none), then a
    soft / hard / straight-through softmax at sampling.tau."""
    noise = None
    if seed is not None:
        noise = gumbel_hash(seed, tuple(s.shape), s.device, s.dtype).masked_fill(torch.isinf(s), 0.0)
    return relaxed_one_hot(s, sampling.tau, hard=sampling.hard, noise=noise,
                           straight_through=sampling.straight_through)


def prefix_extremes(val: torch.Tensor, out: torch.Tensor, heads: list[tuple[int, str]]) -> torch.Tensor:
    """out (R, B, A, T) with the heads listed as (a, "max" | "min") replaced by the extreme of val
    (R, B, A, T) over each causal prefix (the gradient reaches the position holding it)."""
    cols = list(out.unbind(2))
    for a, op in heads:
        cols[a] = (torch.cummax if op == "max" else torch.cummin)(val[:, :, a], -1).values
    return torch.stack(cols, 2)


def running_mean(val: torch.Tensor) -> torch.Tensor:
    """Aggregate heads: (..., T) -> the mean over each causal prefix (..., T)."""
    count = torch.arange(1, val.shape[-1] + 1, dtype=val.dtype, device=val.device)
    return val.cumsum(-1) / count


def route_reference(zq, zk, val, W, u, rel, abs_, scale, content, *, pad: int, tau: float, hard: bool,
                    straight_through: bool, seed: int | None, overlap: bool = False):
    """The routing op as plain torch, with the signature of wtc.kernels.route: -> (out (R, B, H, T),
    per-row overlaps (R, B, H, H, T) with [h, g] = sum_j p_h p_g for g > h, zeros elsewhere, or None)."""
    s = pointer_scores(zq, zk, W, u, rel, abs_, scale, content, pad)
    attn = relax(s, Sampling(tau=tau, hard=hard, straight_through=straight_through), seed)
    out = (attn @ val.unsqueeze(-1)).squeeze(-1)
    if not overlap:
        return out, None
    H = zq.shape[2]
    upper = torch.triu(torch.ones(H, H, dtype=out.dtype, device=out.device), diagonal=1)
    return out, torch.einsum("rbhtl,rbgtl->rbhgt", attn, attn) * upper[:, :, None]


AGG_CHAIN_PRIOR = 4.0      # selection-logit bonus (tau starts at 10): see Attention.__init__
RECENCY_SLOPE = 1.0        # a recency head's score falls by this per position back (times exp(c))


def recency_params(W, u, rel, abs_, content, recent: torch.Tensor, pad: int, slope: float = RECENCY_SLOPE):
    """The score parameters the routing kernels get when some heads are recency heads.

    recent (H,) bool. Recency heads: W = 0, rel[d] = -slope * d for d >= 1 (rel[0] their own,
    learned), abs = 0 at the real positions (the pads' own, learned: where the head goes when no
    key qualifies), content scored in every replica. The other heads keep their parameters, their
    content terms zeroed in replicas without content (what content = 0 did), and every replica is
    marked as scoring content. Differentiable in the parameters that stay free."""
    m = recent.to(W.dtype)                                                   # (H,)
    on = content.to(W.dtype)[:, None]                                       # (R, 1)
    keep = on * (1 - m)[None]                                               # (R, H) content terms kept
    W = W * keep[..., None, None]
    u = u * (keep + m[None])[..., None]
    d = torch.arange(rel.shape[-1], dtype=rel.dtype, device=rel.device)
    ramp = torch.cat([rel[..., :1], (-slope * d[1:]).expand(*rel.shape[:-1], -1)], dim=-1)
    rel = torch.where(recent[None, :, None], ramp, rel)
    real = torch.arange(abs_.shape[-1], device=abs_.device) >= pad
    abs_ = abs_.masked_fill(recent[None, :, None] & real[None, None, :], 0.0)
    return W, u, rel, abs_, torch.ones_like(content)


class Attention(nn.Module):
    """One layer's pointer heads (H) and aggregate heads (A) for R replicas."""

    def __init__(self, layer: int, replicas: int, n_heads: int, n_agg: int, n_bins: int,
                 seq_len: int, pad: int, variable_names: list[str], mask_fn, content: torch.Tensor,
                 offset_prior: float = 1.0, agg_ops: tuple[str, ...] = ("mean",), n_recent: int = 0):
        super().__init__()
        R, H, A, N = replicas, n_heads, n_agg, n_bins
        self.layer, self.H, self.A, self.T, self.P = layer, H, A, seq_len, pad
        L = pad + seq_len
        self.head_names = [f"L{layer}.h{h}" for h in range(H)]
        self.agg_names = [f"L{layer}.a{a}" for a in range(A)]
        self.agg_ops = [agg_ops[a % len(agg_ops)] for a in range(A)]      # DTConfig.agg_ops, cycled
        # (A, T) what the prefix mean is multiplied by: 1 for a mean head, (t + 1) / T for a sum head.
        # A sum head writes sum / T: values as large as a mean's (the raw sum of a sum, up to T^2
        # times x, made every replica's selection flee it early in training; the program line is
        # the sum itself, wtc.extraction.reader)
        count = torch.arange(1, seq_len + 1, dtype=torch.float32)
        unscaled = ("mean",) + EXTREME_OPS
        self.register_buffer("agg_scale", torch.stack([count / seq_len if op not in unscaled else torch.ones(seq_len)
                                                       for op in self.agg_ops]) if A else torch.ones(0, seq_len),
                             persistent=False)
        # max / min heads: the prefix extreme of the value, in its units (prefix_extremes)
        self.extremes = [(a, op) for a, op in enumerate(self.agg_ops) if op in EXTREME_OPS]
        # periodic heads ("per2" ...: wtc.dt.periodic) are sums too, scaled as they are
        self.periodic = PeriodicAggregates(R, self.agg_ops) if any(map(period_of, self.agg_ops)) else None
        slots = ([f"{n}.q" for n in self.head_names] + [f"{n}.k" for n in self.head_names]
                 + [f"{n}.v" for n in self.head_names] + [f"{n}.v" for n in self.agg_names])
        self.select = Selector(R, slots, variable_names, mask_fn(slots, variable_names))
        # aggregate a of layer l >= 1 starts preferring layer l-1's aggregate a in every other
        # replica: without it no replica summed the prefix sum (a sum of sums is two layers of sum
        # heads; soft mixtures early in training favoured the sum of the mean)
        with torch.no_grad():
            for a in range(A):
                prev, slot = f"L{layer - 1}.a{a}", slots.index(f"{self.agg_names[a]}.v")
                if prev in variable_names and self.select.mask[slot, variable_names.index(prev)]:
                    self.select.logits[::2, slot, variable_names.index(prev)] += AGG_CHAIN_PRIOR
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
        # (H,) the last n_recent heads are recency heads (DTConfig.n_recent_heads; from the config,
        # not saved). Their rel[0] starts neutral in even replicas and excluding the query in odd
        # ones: a carry needs j < t, a "last value seen" j <= t, and the population tries both
        self.n_recent = n_recent
        self.register_buffer("recent", torch.arange(H) >= H - n_recent, persistent=False)
        with torch.no_grad():
            for h in range(H - n_recent, H):
                self.rel[:, h, 0] = 0.0
                self.rel[1::2, h, 0] = -offset_prior
        i = torch.arange(seq_len)[:, None] + pad
        j = torch.arange(L)[None, :]
        self.register_buffer("causal", j <= i, persistent=False)                 # (T, L)
        self.hook_scores = HookPoint()    # (R, B, H, T, L)
        self.hook_pattern = HookPoint()   # (R, B, H, T, L)
        self.hook_z = HookPoint()         # (R, B, H + A, T): routed values
        self.pinned: torch.Tensor | None = None   # (R, B, H, T) key indices, see DiscreteTransformer.pinned_pointers

    def unit_growth(self) -> torch.Tensor:
        """(T, A) an aggregate's program unit over its value's: t + 1 for a mean or a sum (both read
        as the sum over the prefix, wtc.dt.submlp's periodic units), 1 for a prefix extreme."""
        count = torch.arange(1, self.T + 1, dtype=self.agg_scale.dtype, device=self.agg_scale.device)
        growth = count[:, None] / self.agg_scale.T
        for a, _ in self.extremes:
            growth[:, a] = 1.0
        return growth

    @property
    def output_names(self) -> list[str]:
        return self.head_names + self.agg_names

    def scores(self, unit: torch.Tensor, choice: Choice) -> torch.Tensor:
        """unit (R, B, L, V) every variable scaled to [0, 1] by its range -> scores (R, B, H, T, L).

        Soft selections mix the scaled values, then encode (PLE of the mixture): once the choice
        is one-hot this is exactly PLE of the chosen variable with uniform bins over its range.
        """
        zq, zk = self._query_key(unit, choice)
        W, u, rel, abs_, content = self.score_params()
        return pointer_scores(zq, zk, W, u, rel, abs_, self.log_scale.exp(), content, self.P)

    def score_params(self) -> tuple[torch.Tensor, ...]:
        """(W, u, rel, abs, content) as the scores use them: the parameters themselves, or with
        recency heads their tied form (recency_params)."""
        if not self.n_recent:
            return self.W, self.u, self.rel, self.abs, self.content
        return recency_params(self.W, self.u, self.rel, self.abs, self.content, self.recent, self.P)

    def _query_key(self, unit: torch.Tensor, choice: Choice) -> tuple[torch.Tensor, torch.Tensor]:
        H, P = self.H, self.P
        zq = choice.read(unit[:, :, P:], slice(0, H)).transpose(2, 3)        # (R, B, H, T)
        zk = choice.read(unit, slice(H, 2 * H)).transpose(2, 3)              # (R, B, H, L)
        return zq, zk

    def forward(self, stream: torch.Tensor, unit: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, dict]:
        """stream (R, B, L, V) in model units and `unit`, the same scaled to [0, 1] per variable
        -> outputs (R, B, H + A, T), stats."""
        H, A, P = self.H, self.A, self.P
        choice = self.select(sampling)
        outs, stats = [], {}
        hooked = self.hook_scores.has_hooks or self.hook_pattern.has_hooks   # they need the materialised tensors
        backend = "reference" if hooked else choose("dt.route", stream)
        fused = backend == "triton"
        if H:
            val = choice.read(stream, slice(2 * H, 3 * H)).transpose(2, 3)       # (R, B, H, L)
            seed = draw_seed(sampling.generator) if sampling.noise else None
            want_overlap = sampling.noise and H > 1 and choice.weights is not None
            if self.pinned is not None:
                outs.append(val.gather(-1, self.pinned))
            elif sampling.native and self.select.frozen and choose("dt.route_hard", stream) == "native":
                outs.append(self._route_native(stream, unit))
            elif backend != "reference" and not (want_overlap and sampling.hard):
                zq, zk = self._query_key(unit, choice)
                kw = dict(pad=P, tau=sampling.tau, hard=sampling.hard, straight_through=sampling.straight_through,
                          seed=seed, overlap=want_overlap)
                W, u, rel, abs_, content = self.score_params()
                args = (zq, zk, val, W, u, rel, abs_, self.log_scale.exp(), content)
                if fused:
                    out, overlap = kernels.route(*args, **kw)
                else:   # native: the log's entropies come with the forward instead of the reference scores
                    out, overlap, *ent = cpu_kernels.route(*args, **kw, entropy=sampling.stats)
                    if sampling.stats:
                        stats["attn_entropy"] = ent[0].mean(dim=(1, 3))
                outs.append(out)
                if want_overlap:   # (R, B, H, H, T) per-row overlaps -> the (R, H, H) mean
                    B, T = out.shape[1], out.shape[3]
                    stats["redundancy"] = self.penalty(overlap.sum(dim=(1, 4)) / (B * T), choice.weights[:, 2 * H:3 * H])
                if sampling.stats and fused:
                    with torch.no_grad():
                        stats["attn_entropy"] = entropy(torch.softmax(self.scores(unit, choice) / sampling.tau, -1)).mean(dim=(1, 3))
            else:
                s = self.hook_scores(self.scores(unit, choice))
                attn = relax(s, sampling, seed)
                if sampling.stats:  # training log: how far heads are from hard pointers
                    stats["attn_entropy"] = entropy(torch.softmax(s.detach() / sampling.tau, -1)).mean(dim=(1, 3))
                attn = self.hook_pattern(attn)
                if want_overlap:
                    stats["redundancy"] = self.redundancy(attn, choice.weights[:, 2 * H:3 * H])
                outs.append((attn @ val.unsqueeze(-1)).squeeze(-1))             # (R, B, H, T)
        if A:
            val = choice.read(stream[:, :, P:], slice(3 * H, None)).transpose(2, 3)  # (R, B, A, T)
            mean = kernels.aggregate(val) if fused else running_mean(val)       # (R, B, A, T)
            out = mean * self.agg_scale if "sum" in self.agg_ops else mean
            if self.extremes:
                out = prefix_extremes(val, out, self.extremes)
            outs.append(out if self.periodic is None else self.periodic(val, out, self.T))
        return self.hook_z(torch.cat(outs, dim=2)), stats

    @staticmethod
    def redundancy(attn: torch.Tensor, value_sel: torch.Tensor) -> torch.Tensor:
        """(R,) how much pairs of heads route the same variable from the same keys.

        attn (R, B, H, T, L), value_sel (R, H, V). Two heads with one pointer and one value variable
        are one head: a penalty on this overlap keeps heads from collapsing onto the offset with the
        strongest signal (seen: every head at t-2 on x_t x_{t-1} + x_{t-2}).
        """
        B, T = attn.shape[1], attn.shape[3]
        return Attention.penalty(torch.einsum("rbhtl,rbgtl->rhg", attn, attn) / (B * T), value_sel)

    @staticmethod
    def penalty(overlap: torch.Tensor, value_sel: torch.Tensor) -> torch.Tensor:
        """overlap (R, H, H) mean attention overlap of head pairs, value_sel (R, H, V) -> (R,)."""
        H = overlap.shape[1]
        same_value = torch.einsum("rhv,rgv->rhg", value_sel, value_sel)
        pairs = torch.triu(torch.ones(H, H, dtype=overlap.dtype, device=overlap.device), diagonal=1)
        return (overlap * same_value * pairs).sum(dim=(1, 2))

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
        W, u, rel, abs_, content = self.score_params()
        on = content[:, None, None]
        _, value, _ = _native.cpu_module().route_hard(
            f32(pick(unit, idx[:, :H])[:, :, P:]), f32(pick(unit, idx[:, H:2 * H])),
            f32(pick(stream, idx[:, 2 * H:3 * H])), bins, bins,
            f32((W * on[..., None]).reshape(R * H, N, N)), f32((u * on).reshape(R * H, N)),
            f32(rel.reshape(R * H, -1)), f32(abs_.reshape(R * H, -1)), P)
        # (the positive per-head scale exp(c) does not change an argmax, so the kernel skips it)
        return torch.from_numpy(value).to(stream.dtype).reshape(R, H, B, self.T).permute(0, 2, 1, 3)
