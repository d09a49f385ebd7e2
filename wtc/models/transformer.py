"""A small causal token transformer whose parameter and hook names are TransformerLens's.

Parameters: embed.W_E (V, D), pos_embed.W_pos (n_ctx, D), blocks.{l}.attn.W_Q/W_K/W_V (H, D, d_head),
W_O (H, d_head, D), b_Q/b_K/b_V (H, d_head), b_O (D), blocks.{l}.mlp.W_in (D, d_mlp), b_in, W_out
(d_mlp, D), b_out, optional blocks.{l}.ln1/ln2/ln_final .w/.b (LN) or .w (RMS), unembed.W_U (D, V), b_U.
So a state dict moves to and from a HookedTransformer unchanged. Hooks (wtc.hooks.Hooked: hooks(),
run_with_hooks(), run_with_cache()): hook_embed, hook_pos_embed, blocks.{l}.hook_resid_pre,
attn.hook_q/hook_k/hook_v, attn.hook_pattern, attn.hook_z, hook_attn_out, hook_resid_mid, mlp.hook_pre,
mlp.hook_post, hook_mlp_out, hook_resid_post, ln_final.hook_normalized (RMS: also hook_scale; as in
TL, RMS hook_normalized is x / scale, before w). mlp_abstopk (fraction f): the MLP keeps, per
position, the round(f * d_mlp) hidden units of largest |post-activation| and zeroes the rest
(AbsTopK, Gao et al. 2025), before hook_post, so hook_post is what W_out reads. With bias=False
the biases are zero buffers, not parameters: they are neither trained nor scanned, and the state
dict still has TL's layout.

The forward is split (embed -> block(l) -> unembed) so scans can cache the clean prefix and run
only the rest of the network (wtc.scan).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

import torch
import torch.nn.functional as F
from torch import nn

from wtc.arguments import KnownFields
from wtc.errors import ModelConfigError, ModelInputError, ModelInputTypeError
from wtc.hooks import Hooked, HookPoint


@dataclass
class TransformerConfig(KnownFields):
    """The shape of a `Transformer`: layers, widths, heads, vocabulary and context, activation,
    normalisation, which blocks have an MLP, biases and AbsTopK; an unknown field or a bad value
    is a one-line ModelConfigError."""
    _field_error = ModelConfigError          # an unknown keyword (wtc.arguments.KnownFields)

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_head: int = 32
    d_mlp: int | None = 512         # None: attention-only blocks
    d_vocab: int = 64
    n_ctx: int = 128
    act_fn: str = "relu"            # relu | gelu
    normalization: str | None = None   # None | "LN" | "RMS" (TransformerLens's, eps 1e-5)
    mlp_layers: tuple[int, ...] | None = None   # blocks that have an MLP (None: all, when d_mlp)
    bias: bool = True               # False: every bias is a fixed zero buffer (kept for TL export)
    mlp_abstopk: float | None = None   # AbsTopK on the MLP hidden layer: fraction of units kept per position

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "d_head", "d_vocab", "n_ctx"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)) or v <= 0:
                raise ModelConfigError(f"TransformerConfig.{name} must be a positive int, got {v!r}")
            setattr(self, name, int(v))          # a numpy integer as an int (the config is written as JSON)
        if self.d_mlp is not None:
            if not isinstance(self.d_mlp, numbers.Integral) or isinstance(self.d_mlp, (bool, np.bool_)) or self.d_mlp <= 0:
                raise ModelConfigError(f"TransformerConfig.d_mlp must be None or a positive int, got {self.d_mlp!r}")
            self.d_mlp = int(self.d_mlp)
        D, M = self.d_model, self.d_mlp or 0
        n = 2 * self.d_vocab * D + self.n_ctx * D + self.n_layers * (4 * self.n_heads * self.d_head * D + 2 * D * M)
        if n > MAX_PARAMETERS:                       # building it would allocate (or hang) for minutes first
            raise ModelConfigError(f"TransformerConfig would hold up to ~{n:.3g} parameters (more than "
                                   f"{MAX_PARAMETERS:.3g}, {4 * n / 2**30:.3g} GiB in float32); check n_layers, "
                                   "d_model, d_mlp, d_vocab, n_ctx")
        if self.act_fn not in ("relu", "gelu"):
            raise ModelConfigError(f"TransformerConfig.act_fn must be 'relu' or 'gelu', got {self.act_fn!r}")
        if self.normalization not in (None, "LN", "RMS"):
            raise ModelConfigError(f"TransformerConfig.normalization must be None, 'LN' or 'RMS', got {self.normalization!r}")
        if self.mlp_layers is None:
            self.mlp_layers = tuple(range(self.n_layers)) if self.d_mlp else ()
        if isinstance(self.mlp_layers, (str, bytes)) or not isinstance(self.mlp_layers, (list, tuple, range)):
            raise ModelConfigError(f"TransformerConfig.mlp_layers must be None or a list of block indices, "
                                   f"got {self.mlp_layers!r}")
        if any(not isinstance(l, numbers.Integral) or isinstance(l, (bool, np.bool_)) for l in self.mlp_layers):
            raise ModelConfigError(f"TransformerConfig.mlp_layers must hold block indices (ints), got {list(self.mlp_layers)!r}")
        self.mlp_layers = tuple(int(l) for l in self.mlp_layers)
        if len(set(self.mlp_layers)) != len(self.mlp_layers):
            raise ModelConfigError(f"TransformerConfig.mlp_layers {self.mlp_layers} names a block twice")
        if any(not 0 <= l < self.n_layers for l in self.mlp_layers):
            raise ModelConfigError(f"TransformerConfig.mlp_layers {self.mlp_layers} must index blocks 0..{self.n_layers - 1}")
        if self.mlp_layers and not self.d_mlp:
            raise ModelConfigError("TransformerConfig.mlp_layers given but d_mlp is None")
        if not isinstance(self.bias, bool):
            raise ModelConfigError(f"TransformerConfig.bias must be True or False, got {self.bias!r}")
        if self.mlp_abstopk is not None:
            f = self.mlp_abstopk
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise ModelConfigError(f"TransformerConfig.mlp_abstopk must be None or a fraction in (0, 1], got {f!r}")


MAX_PARAMETERS = 2**34
INT64_MAX = 2**63 - 1


def _bias(module: nn.Module, name: str, size, trained: bool) -> None:
    """A zero-initialised bias: a parameter, or a fixed zero buffer when the model has no biases."""
    if trained:
        module.register_parameter(name, nn.Parameter(torch.zeros(size)))
    else:
        module.register_buffer(name, torch.zeros(size))


class LayerNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))
        self.hook_normalized = HookPoint()

    def forward(self, x):
        return self.hook_normalized(F.layer_norm(x, x.shape[-1:], self.w, self.b, eps=1e-5))


class RMSNorm(nn.Module):
    """TransformerLens's RMSNorm: x / sqrt(mean(x^2) + eps) * w, eps 1e-5 (no centring, no bias)."""

    def __init__(self, d: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.hook_scale = HookPoint()         # (..., 1)
        self.hook_normalized = HookPoint()    # (..., d), before w (as in TL)

    def forward(self, x):
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
        return self.hook_normalized(x / scale) * self.w


def _norm(cfg: TransformerConfig, d: int) -> nn.Module:
    return {"LN": LayerNorm, "RMS": RMSNorm}[cfg.normalization](d) if cfg.normalization else nn.Identity()


def abstopk(x: torch.Tensor, fraction: float) -> torch.Tensor:
    """Keep the round(fraction * n) (at least 1) entries of largest |x| along the last axis, zero the rest."""
    k = max(1, round(fraction * x.shape[-1]))
    if k >= x.shape[-1]:
        return x
    keep = torch.zeros_like(x, dtype=torch.bool).scatter(-1, x.abs().topk(k, dim=-1, sorted=False).indices, True)
    return x * keep


class Embed(nn.Module):
    def __init__(self, V: int, D: int):
        super().__init__()
        self.W_E = nn.Parameter(torch.randn(V, D) / math.sqrt(D))

    def forward(self, tokens):
        return self.W_E[tokens]                                   # (B, T, D)


class PosEmbed(nn.Module):
    def __init__(self, n_ctx: int, D: int):
        super().__init__()
        self.W_pos = nn.Parameter(torch.randn(n_ctx, D) / math.sqrt(D))

    def forward(self, tokens):
        return self.W_pos[: tokens.shape[-1]]                     # (T, D)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        H, D, d = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_K = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_V = nn.Parameter(torch.randn(H, D, d) / math.sqrt(D))
        self.W_O = nn.Parameter(torch.randn(H, d, D) / math.sqrt(H * d))
        for name, size in (("b_Q", (H, d)), ("b_K", (H, d)), ("b_V", (H, d)), ("b_O", (D,))):
            _bias(self, name, size, cfg.bias)
        self.hook_q = HookPoint()         # (B, Tq, H, d_head)
        self.hook_k = HookPoint()         # (B, T, H, d_head)
        self.hook_v = HookPoint()
        self.hook_pattern = HookPoint()   # (B, H, Tq, Tk)
        self.hook_z = HookPoint()         # (B, T, H, d_head)

    def forward(self, x, queries: slice = slice(None)):           # x (B, T, D)
        """Outputs at the query positions `queries` (all by default), attending causally to x."""
        q = self.hook_q(torch.einsum("btd,hde->bthe", x[:, queries], self.W_Q) + self.b_Q)   # (B, Tq, H, d_head)
        k = self.hook_k(torch.einsum("btd,hde->bthe", x, self.W_K) + self.b_K)
        v = self.hook_v(torch.einsum("btd,hde->bthe", x, self.W_V) + self.b_V)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])   # (B, H, Tq, T)
        T = x.shape[-2]
        positions = torch.arange(T, device=x.device)
        causal = positions[queries, None] >= positions[None, :]                  # (Tq, T)
        pattern = self.hook_pattern(scores.masked_fill(~causal, float("-inf")).softmax(-1))
        z = self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        return torch.einsum("bqhe,hed->bqd", z, self.W_O) + self.b_O


class MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        D, M = cfg.d_model, cfg.d_mlp
        self.W_in = nn.Parameter(torch.randn(D, M) / math.sqrt(D))
        self.W_out = nn.Parameter(torch.randn(M, D) / math.sqrt(M))
        _bias(self, "b_in", (M,), cfg.bias)
        _bias(self, "b_out", (D,), cfg.bias)
        self.act = F.relu if cfg.act_fn == "relu" else F.gelu
        self.abstopk = cfg.mlp_abstopk
        self.hook_pre = HookPoint()       # (B, T, d_mlp)
        self.hook_post = HookPoint()      # after AbsTopK when there is one: what W_out reads

    def forward(self, x):
        post = self.act(self.hook_pre(x @ self.W_in + self.b_in))
        if self.abstopk is not None:
            post = abstopk(post, self.abstopk)
        post = self.hook_post(post)
        return post @ self.W_out + self.b_out


class Unembed(nn.Module):
    def __init__(self, D: int, V: int, bias: bool = True):
        super().__init__()
        self.W_U = nn.Parameter(torch.randn(D, V) / math.sqrt(D))
        _bias(self, "b_U", (V,), bias)

    def forward(self, h):
        return h @ self.W_U + self.b_U                            # (B, T, V)


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer: int):
        super().__init__()
        self.ln1 = _norm(cfg, cfg.d_model)
        self.attn = Attention(cfg)
        self.has_mlp = layer in cfg.mlp_layers
        if self.has_mlp:
            self.ln2 = _norm(cfg, cfg.d_model)
            self.mlp = MLP(cfg)
            self.hook_mlp_out = HookPoint()    # (B, Tq, D): the MLP's output, before it joins the residual
        self.hook_attn_out = HookPoint()       # (B, Tq, D): the attention output, before it joins the residual
        self.hook_resid_pre = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid, queries: slice = slice(None)):       # (B, T, D) -> (B, Tq, D)
        resid = self.hook_resid_pre(resid)
        resid = self.hook_resid_mid(resid[:, queries] + self.hook_attn_out(self.attn(self.ln1(resid), queries)))
        if self.has_mlp:
            resid = resid + self.hook_mlp_out(self.mlp(self.ln2(resid)))
        return self.hook_resid_post(resid)


class Transformer(Hooked):
    """tokens (B, T) int64 -> logits (B, T, V)."""

    def __init__(self, cfg: TransformerConfig | None = None, seed: int | None = None):
        super().__init__()
        if cfg is not None and not isinstance(cfg, TransformerConfig):
            hint = " (TransformerConfig(**d) for a dict)" if isinstance(cfg, dict) else ""
            raise ModelConfigError(f"cfg must be a TransformerConfig{hint}, got {type(cfg).__name__}")
        self.cfg = cfg = cfg or TransformerConfig()
        if seed is not None:
            from wtc import arguments
            torch.manual_seed(arguments.seed(seed, error=ModelConfigError))
        self.embed = Embed(cfg.d_vocab, cfg.d_model)
        self.pos_embed = PosEmbed(cfg.n_ctx, cfg.d_model)
        self.hook_embed = HookPoint()
        self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg, l) for l in range(cfg.n_layers))
        self.ln_final = _norm(cfg, cfg.d_model)
        self.unembed = Unembed(cfg.d_model, cfg.d_vocab, cfg.bias)
        self.setup_hooks()

    def check_tokens(self, tokens) -> torch.Tensor:
        if isinstance(tokens, np.ndarray) and tokens.dtype.kind == "u" and tokens.size and int(tokens.max()) > INT64_MAX:
            raise ModelInputError(f"token ids must lie in [0, {self.cfg.d_vocab}), got {int(tokens.max())}")
        try:
            tokens = torch.as_tensor(tokens)
        except (TypeError, ValueError, RuntimeError) as exc:      # ragged lists, text, None, object arrays
            raise ModelInputError(f"tokens must be an integer tensor (B, T), got {type(tokens).__name__} "
                                  f"that is not one ({exc})") from None
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool or tokens.ndim != 2:
            raise ModelInputError(f"tokens must be an integer tensor (B, T), got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.dtype in (torch.uint16, torch.uint32, torch.uint64):     # torch has no min/max for these
            if tokens.dtype == torch.uint64 and tokens.numel() and bool((tokens.view(torch.int64) < 0).any()):
                raise ModelInputError(f"token ids must lie in [0, {self.cfg.d_vocab}), got ids beyond int64")
            tokens = tokens.to(torch.int64)
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ModelInputError(f"tokens have {tokens.shape[1]} positions, more than n_ctx={self.cfg.n_ctx}")
        device = next(self.parameters()).device
        if tokens.device != device:       # torch's own error would come from inside the embedding
            raise ModelInputError(f"tokens are on {tokens.device}, the model on {device}: move them first "
                                  f"(tokens.to({str(device)!r}))")
        if device.type == "meta":         # shapes only: no ids to check
            return tokens.long()
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.cfg.d_vocab):
            raise ModelInputError(f"token ids must lie in [0, {self.cfg.d_vocab}), got [{int(tokens.min())}, {int(tokens.max())}]")
        return tokens.long()

    def embed_tokens(self, tokens):
        return self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(tokens))

    def final_hidden(self, resid):
        """The vector the unembedding reads (after ln_final when there is one)."""
        return self.ln_final(resid)

    def logits_from(self, resid, start: int = 0):
        """Run blocks start.. on a residual stream (B, T, D) and unembed."""
        for block in self.blocks[start:]:
            resid = block(resid)
        return self.unembed(self.final_hidden(resid))

    def forward(self, tokens):
        return self.logits_from(self.embed_tokens(self.check_tokens(tokens)))

    def logits_at(self, tokens, positions: slice):
        """Logits (B, len(positions), V) at some positions only: the same numbers as
        forward(tokens)[:, positions], with the last block run for those queries alone (a task read
        out at one position trains several times faster; hooks of the last block see those rows)."""
        if not isinstance(positions, slice):
            raise ModelInputTypeError(f"positions must be a slice, got {type(positions).__name__}")
        if positions.step is not None and (not isinstance(positions.step, int) or positions.step < 1):
            raise ModelInputError(f"positions must be a slice with a positive step, got {positions!r}")
        resid = self.embed_tokens(self.check_tokens(tokens))
        for block in self.blocks[:-1]:
            resid = block(resid)
        return self.unembed(self.final_hidden(self.blocks[-1](resid, positions)))
