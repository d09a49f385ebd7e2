"""Conditional zero-ablation: a weight zeroed only in the computations at some positions.

Every weight of a wtc Transformer enters the forward pass as one term of a linear map applied at
one position: output[b, t, o] += W[.., i, o] * input[b, t, i]. Zeroing it "at positions S" removes
that term where S holds, and the rest of the network runs on as usual, so an effect applied at
position t can still reach later positions through attention. Implemented exactly with hooks:
the input coordinate is captured where the map reads it, and the term is subtracted at the hook
where the map's output appears (TransformerLens hook names):

    embed.W_E[v, d]        hook_embed, channel d, where the token is v       (input: the one-hot token)
    pos_embed.W_pos[t, d]  blocks.0.hook_resid_pre, channel d, at position t
    attn.W_Q/W_K/W_V[h, d, e]  attn.hook_q/k/v, head h channel e         (input: the attention input)
    attn.W_O[h, e, d]      hook_attn_out, channel d                      (input: attn.hook_z)
    mlp.W_in[d, m]         mlp.hook_pre, neuron m                        (input: the MLP input)
    mlp.W_out[m, d]        hook_mlp_out, channel d                       (input: mlp.hook_post)
    unembed.W_U[d, v]      logits, vocabulary entry v                    (input: the final hidden)

With S = every position this is exactly the zeroed weight (tested against zeroing it); with any S
it equals a forward pass whose weight depends on the position (tested against one written out).

Additive shortcut: when nothing after the weight mixes positions (the unembedding, the last
block's MLP, and its W_Q and W_O), the KL at a position depends only on whether the weight is
zeroed there, so A(S) is the sum over S of the fully ablated per-position KL: exact, no forward.

Other models (Hugging Face causal LMs, bridges: any parameter without these names) take the same
definition at the module holding the weight (nn.Linear, Conv1D, nn.Embedding):
wtc.explain.conditional_modules.
"""
from __future__ import annotations

import contextlib
import re

import numpy as np
import torch

from wtc.errors import ArgumentError, IndexOutOfRange, ScanError, UnknownName
from wtc.hooks import hook_modules

_PATTERN = re.compile(r"^(embed\.W_E|pos_embed\.W_pos|unembed\.W_U|blocks\.(\d+)\.(attn\.W_[QKVO]|mlp\.W_in|mlp\.W_out))$")


def is_matrix(name: str) -> bool:
    """Whether `name` is one of the wtc Transformer weight matrices conditional ablation handles (not a bias or norm)."""
    return _PATTERN.match(name) is not None


def _by_module(model, name: str) -> bool:
    """Whether `name` goes the library-module way (wtc.explain.conditional_modules): a parameter
    of the model without a wtc Transformer matrix name (Hugging Face models, bridges)."""
    return _PATTERN.match(name) is None and isinstance(name, str) and name in dict(model.named_parameters())


def matrices(model) -> list[str]:
    """The weight matrices of `model` conditional ablation handles: a wtc Transformer's by name,
    any other model's by the module holding them (nn.Linear, Conv1D, nn.Embedding)."""
    names = [k for k, _ in model.named_parameters()]
    if any(is_matrix(k) for k in names):
        return [k for k in names if is_matrix(k)]
    from wtc.explain import conditional_modules
    return conditional_modules.matrices(model)


def _parse(model, name: str) -> tuple[str, int | None]:
    m = _PATTERN.match(name)
    if m is None or not hasattr(model, "blocks"):
        raise UnknownName(f"conditional ablation supports wtc Transformer matrices (embed.W_E, pos_embed.W_pos, "
                       f"blocks.L.attn.W_Q/W_K/W_V/W_O, blocks.L.mlp.W_in/W_out, unembed.W_U), got {name!r}")
    if m.group(2) is None:
        return m.group(1), None
    layer = int(m.group(2))
    if layer >= len(model.blocks):
        raise UnknownName(f"{name!r}: the model has {len(model.blocks)} blocks")
    if m.group(3).startswith("mlp") and not model.blocks[layer].has_mlp:
        raise UnknownName(f"{name!r}: block {layer} has no MLP")
    return m.group(3), layer


def is_local(model, name: str) -> bool:
    """Whether the effect of zeroing `name` at a position stays at that position."""
    if _by_module(model, name):
        from wtc.explain import conditional_modules
        return conditional_modules.is_local(model, name)
    kind, layer = _parse(model, name)
    if kind == "unembed.W_U":
        return True
    return layer == len(model.blocks) - 1 and kind in ("attn.W_Q", "attn.W_O", "mlp.W_in", "mlp.W_out")


def _bool_mask(mask) -> torch.Tensor:
    """A (B, T) mask as bool; a numeric one only when it holds nothing but 0 and 1 (0.3 is no answer)."""
    mask = torch.as_tensor(mask)
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ArgumentError(f"mask must be a bool (B, T) tensor (True where the weight is zeroed), got {mask.dtype} "
                            "values other than 0 and 1")
    return mask.to(torch.bool)


@contextlib.contextmanager
def zeroed_at(model, name: str, index: tuple[int, ...], mask: torch.Tensor, tokens: torch.Tensor):
    """Within the block, model(tokens) runs with weight `name`[index] zeroed at the positions where
    mask (B, T) is True (B, T must be those of `tokens`). Weights of other models than wtc
    Transformers: wtc.explain.conditional_modules (the same definition, at the holding module)."""
    if _by_module(model, name):
        from wtc.explain import conditional_modules
        with conditional_modules.zeroed_at(model, name, index, _bool_mask(mask), tokens):
            yield
        return
    kind, layer = _parse(model, name)
    W = dict(model.named_parameters())[name]
    if not isinstance(index, (tuple, list)) or not all(isinstance(i, (int, np.integer)) and
                                                       not isinstance(i, (bool, np.bool_)) for i in index):
        raise ArgumentError(f"index must be a tuple of ints (one per dimension of {name}), got {index!r}")
    index = tuple(int(i) for i in index)
    if len(index) != W.ndim or any(not 0 <= i < s for i, s in zip(index, W.shape)):
        raise IndexOutOfRange(f"index {index} out of range for {name} {tuple(W.shape)}")
    mask = _bool_mask(mask).to(device=W.device)
    if mask.shape != tokens.shape[:2]:
        raise ArgumentError(f"mask must be shaped like the tokens {tuple(tokens.shape)}, got {tuple(mask.shape)}")
    w = W.detach()[index]
    m = mask.to(W.dtype)                                               # (B, T)
    seen: dict[str, torch.Tensor] = {}
    fwd = []                   # (hook point name, fn)
    inputs, outputs = [], []   # (module path, fn) on a module's input / output: values no hook point holds

    def capture(key):
        return lambda value, hook: seen.__setitem__(key, value.detach())

    def subtract(term_fn, out_index):
        def fn(out, hook):
            out = out.clone()
            out[out_index] = out[out_index] - term_fn()
            return out
        return fn

    prefix = f"blocks.{layer}." if layer is not None else ""
    if kind == "embed.W_E":
        v, d = index
        fwd.append(("hook_embed", subtract(lambda: w * m * (tokens == v).to(W.dtype), (Ellipsis, d))))
    elif kind == "pos_embed.W_pos":
        t, d = index
        fwd.append(("blocks.0.hook_resid_pre", subtract(lambda: w * m[:, t], (slice(None), t, d))))
    elif kind in ("attn.W_Q", "attn.W_K", "attn.W_V"):
        h, d, e = index
        inputs.append((prefix + "attn", capture("x")))

        def qkv_hook(out, hook):
            out = out.clone()                                        # (B, Tq or T, H, d_head)
            T = out.shape[1]
            x = seen["x"]
            # queries may be a suffix of the positions (Transformer.logits_at); keys and values never are
            rows = slice(x.shape[1] - T, None)
            out[:, :, h, e] = out[:, :, h, e] - w * m[:, rows] * x[:, rows, d]
            return out
        fwd.append((prefix + {"attn.W_Q": "attn.hook_q", "attn.W_K": "attn.hook_k", "attn.W_V": "attn.hook_v"}[kind],
                    qkv_hook))
    elif kind == "attn.W_O":
        h, e, d = index
        fwd.append((prefix + "attn.hook_z", capture("z")))
        fwd.append((prefix + "hook_attn_out",
                    subtract(lambda: w * m[:, -seen["z"].shape[1]:] * seen["z"][:, :, h, e], (Ellipsis, d))))
    elif kind == "mlp.W_in":
        d, n = index
        inputs.append((prefix + "mlp", capture("x")))
        fwd.append((prefix + "mlp.hook_pre",
                    subtract(lambda: w * m[:, -seen["x"].shape[1]:] * seen["x"][..., d], (Ellipsis, n))))
    elif kind == "mlp.W_out":
        n, d = index
        fwd.append((prefix + "mlp.hook_post", capture("post")))
        fwd.append((prefix + "hook_mlp_out",
                    subtract(lambda: w * m[:, -seen["post"].shape[1]:] * seen["post"][..., n], (Ellipsis, d))))
    else:                                                              # unembed.W_U
        d, v = index
        inputs.append(("unembed", capture("h")))
        outputs.append(("unembed", subtract(lambda: w * m[:, -seen["h"].shape[1]:] * seen["h"][..., d], (Ellipsis, v))))
    with model.hooks(fwd), hook_modules(model, inputs, on="input"), hook_modules(model, outputs):
        yield


@torch.no_grad()
def conditional_kl(model, tokens: torch.Tensor, name: str, index, masks, clean_logp: torch.Tensor | None = None,
                   per_position: bool = False):
    """Total KL(clean || zeroed at S) summed over all positions, for each mask S in `masks` (a (B, T)
    bool tensor or a list of them); float64. per_position=True gives (len(masks), B, T) instead.
    The masks run as one batch (the tokens repeated)."""
    from wtc.scan.inputs import as_tokens, vocab_size
    try:                    # integer ids only: float tokens would be truncated, negative ones index from the end
        tokens = as_tokens(tokens, model)
    except ScanError as exc:
        raise ArgumentError(str(exc)) from None
    single = torch.is_tensor(masks) or isinstance(masks, np.ndarray)
    masks = [masks] if single else list(masks)
    if not masks:
        raise ArgumentError("masks must be a (B, T) bool tensor or a non-empty list of them")
    if clean_logp is None:
        clean_logp = torch.log_softmax(model(tokens).double(), -1)
    elif (not torch.is_tensor(clean_logp) or clean_logp.ndim != 3 or clean_logp.shape[:2] != tokens.shape
          or clean_logp.shape[2] != (vocab_size(model) or clean_logp.shape[2])):
        raise ArgumentError(f"clean_logp must be the model's clean log-probabilities (B, T, V) for tokens "
                            f"{tuple(tokens.shape)}, got {tuple(clean_logp.shape) if torch.is_tensor(clean_logp) else type(clean_logp).__name__}")
    k = len(masks)
    rep = tokens.repeat(k, 1)
    stacked = torch.cat([_bool_mask(s) for s in masks])                                       # (k*B, T)
    with zeroed_at(model, name, index, stacked, rep):
        logp = torch.log_softmax(model(rep).double(), -1)
    kl = (clean_logp.exp().repeat(k, 1, 1) * (clean_logp.repeat(k, 1, 1) - logp)).sum(-1)     # (k*B, T)
    # a row with nothing zeroed is the clean model by definition; BLAS may round a batch of 2B rows
    # differently from one of B, and that noise (~1e-16) is not an effect of the weight
    untouched = ~stacked.to(kl.device).any(1)
    kl = kl.masked_fill(untouched[:, None], 0.0)
    kl = kl.clamp_min(0).reshape(k, *tokens.shape)
    out = kl if per_position else kl.sum((1, 2))
    return out[0] if single else out


__all__ = ["zeroed_at", "conditional_kl", "is_local", "is_matrix", "matrices"]
