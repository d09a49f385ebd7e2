"""Moving weights between wtc.models.Transformer and TransformerLens's HookedTransformer, and
TransformerLens's TransformerBridge over a local Hugging Face model (`load_bridge`).

The parameter names are the same, so a state dict moves almost unchanged: blocks without an MLP
export a zero MLP (relu(0 @ W_in) @ W_out = 0, and TL has no per-block MLP switch), a model without
biases exports zero biases, and TL's buffers (masks, IGNORE) are left out on the way back. The
state-dict functions need no TransformerLens. TransformerBridge (load_bridge) is in TransformerLens 3
and 4 (4.x, pinned in constraints.txt, needs transformers >= 5.9); HookedTransformer, which the
to_/from_hooked_transformer functions build and read, is in 3.x only (4.0 removed it).

A TransformerBridge names its hook points after the wrapped model's modules ("blocks.0.hook_out")
and keeps the HookedTransformer names ("blocks.0.hook_resid_post", "blocks.0.hook_attn_out", ...) as
aliases in its `hook_dict`; wtc's hooks (wtc.hooks.hook_modules, so ACE, patching and the scans)
resolve either, so a bridge is used like any model: extract_core(bridge, tokens,
"blocks.1.hook_resid_post", ...).
"""
from __future__ import annotations

import torch

from wtc.models.transformer import Transformer, TransformerConfig
from wtc.errors import ModelConfigError

_BIASES = ("attn.b_Q", "attn.b_K", "attn.b_V", "attn.b_O", "mlp.b_in", "mlp.b_out")


def _tl():
    try:
        import transformer_lens  # noqa: F401
    except ImportError as exc:
        raise ImportError("TransformerLens is not installed (optional: pip install -c constraints.txt 'wtc[tl]')") from exc
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        from importlib.metadata import version
        raise ImportError(f"HookedTransformer was removed in TransformerLens 4 (installed: {version('transformer_lens')}): "
                          "converting to and from it needs TransformerLens 3 (pip install 'transformer_lens>=3,<4' "
                          "'transformers<5'); with 4.x, read a Hugging Face model directory through "
                          "wtc.models.tl.load_bridge") from None
    return HookedTransformer, HookedTransformerConfig


def to_tl_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """A state dict in HookedTransformer's layout (zero MLPs where a block has none)."""
    c = model.cfg
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if c.mlp_layers and len(c.mlp_layers) < c.n_layers:
        like = next(v for k, v in state.items() if k.endswith("mlp.W_in"))
        for layer in sorted(set(range(c.n_layers)) - set(c.mlp_layers)):
            state[f"blocks.{layer}.mlp.W_in"] = torch.zeros(c.d_model, c.d_mlp, dtype=like.dtype)
            state[f"blocks.{layer}.mlp.b_in"] = torch.zeros(c.d_mlp, dtype=like.dtype)
            state[f"blocks.{layer}.mlp.W_out"] = torch.zeros(c.d_mlp, c.d_model, dtype=like.dtype)
            state[f"blocks.{layer}.mlp.b_out"] = torch.zeros(c.d_model, dtype=like.dtype)
    return state


def from_tl_state_dict(state: dict[str, torch.Tensor], cfg: TransformerConfig) -> Transformer:
    """A wtc Transformer with `cfg` from a HookedTransformer-layout state dict. The MLP of a block
    outside cfg.mlp_layers, and every bias when cfg.bias is False, must be exactly zero there:
    dropping them must not change the function."""
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise ModelConfigError(f"state must be a state dict (parameter name -> tensor), got {type(state).__name__}")
    bad = [k for k, v in state.items() if not torch.is_tensor(v)]
    if bad:
        raise ModelConfigError(f"state dict values must be tensors; {bad[:3]} are {type(state[bad[0]]).__name__}")
    weights = {k: v for k, v in state.items() if not (k.endswith("IGNORE") or k.endswith(".mask"))}
    bad = [k for k, v in weights.items() if not v.is_floating_point()]
    if bad:
        raise ModelConfigError(f"state dict weights must be real floating-point tensors; {bad[:3]} are "
                               f"{weights[bad[0]].dtype}")
    dtypes = sorted({str(v.dtype) for v in weights.values()})
    if len(dtypes) > 1:           # loading casts every tensor to one dtype: a float16 one would round the rest
        raise ModelConfigError(f"state dict weights mix dtypes {dtypes}; convert them to one first")
    bad = [k for k, v in weights.items() if not torch.isfinite(v).all()]
    if bad:
        raise ModelConfigError(f"state dict holds non-finite values (NaN or inf) in {bad[:5]}")
    model = Transformer(cfg)
    ours = model.state_dict()
    dropped = [k for k in state if k not in ours and not (k.endswith("IGNORE") or k.endswith(".mask"))]
    for k in dropped:
        parts = k.split(".")
        if len(parts) != 4 or parts[0] != "blocks" or parts[2] != "mlp":
            raise ModelConfigError(f"state dict key {k!r} has no place in a wtc Transformer with this config")
    nonzero = [k for k in dropped if bool(state[k].abs().max() > 0)]
    if not cfg.bias:
        nonzero += [k for k in state if k in ours and k.endswith(_BIASES + ("unembed.b_U",))
                    and bool(state[k].abs().max() > 0)]
    if nonzero:
        raise ModelConfigError(f"these weights are nonzero but the config has no place for them "
                         f"(mlp_layers={cfg.mlp_layers}, bias={cfg.bias}): {nonzero}")
    missing = [k for k in ours if k not in state]
    if missing:
        raise ModelConfigError(f"state dict lacks {missing}")
    dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    model = model.to(dtype)
    try:
        model.load_state_dict({k: state[k] for k in ours})
    except RuntimeError as exc:                 # shapes that do not fit the config
        raise ModelConfigError(f"the state dict does not fit this TransformerConfig: {exc}") from None
    return model.eval()


def to_hooked_transformer(model: Transformer):
    """A HookedTransformer computing the same logits as `model`."""
    c = model.cfg
    if c.mlp_abstopk is not None:
        raise ModelConfigError(f"TransformerLens has no AbsTopK MLP: a model with mlp_abstopk={c.mlp_abstopk} cannot be exported")
    HookedTransformer, HookedTransformerConfig = _tl()
    tl_cfg = HookedTransformerConfig(n_layers=c.n_layers, d_model=c.d_model, n_ctx=c.n_ctx, d_head=c.d_head,
                                     n_heads=c.n_heads, d_mlp=c.d_mlp, d_vocab=c.d_vocab, act_fn=c.act_fn,
                                     normalization_type=c.normalization, attn_only=not c.mlp_layers,
                                     positional_embedding_type="standard", dtype=next(model.parameters()).dtype)
    tl = HookedTransformer(tl_cfg)
    missing, unexpected = tl.load_state_dict(to_tl_state_dict(model), strict=False)
    if unexpected or any(not (k.endswith("IGNORE") or k.endswith(".mask")) for k in missing):
        raise ModelConfigError(f"state dict mismatch with TransformerLens: missing {missing}, unexpected {unexpected}")
    return tl.eval()


def from_hooked_transformer(tl, mlp_layers: tuple[int, ...] | None = None, bias: bool = True) -> Transformer:
    """A wtc Transformer with the weights of a (standard; LN, RMS or no-norm) HookedTransformer; pass
    mlp_layers / bias=False to get back a model exported without some MLPs or without biases."""
    c = tl.cfg
    if c.positional_embedding_type != "standard" or c.normalization_type not in (None, "LN", "RMS"):
        raise ModelConfigError(f"only standard positions and LN/RMS/no normalization are supported, got "
                         f"{c.positional_embedding_type!r}, {c.normalization_type!r}")
    cfg = TransformerConfig(n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads, d_head=c.d_head,
                            d_mlp=None if c.attn_only else c.d_mlp, d_vocab=c.d_vocab, n_ctx=c.n_ctx,
                            act_fn=c.act_fn, normalization=c.normalization_type, mlp_layers=mlp_layers, bias=bias)
    return from_tl_state_dict(tl.state_dict(), cfg)


def load_bridge(path, device: str = "cpu"):
    """A TransformerLens TransformerBridge over the Hugging Face causal LM in the local directory
    `path` (its weights and its tokenizer; nothing is downloaded: the model is loaded by
    transformers first and handed to the bridge, and the hub is set offline for the call)."""
    import os
    from pathlib import Path

    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as exc:
        raise ImportError("TransformerLens >= 3 (its TransformerBridge) is not installed (optional: pip install -c "
                          "constraints.txt 'wtc[tl]')") from exc
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wtc.models.hf import HFModelError, _quiet

    p = Path(path)
    if not (p / "config.json").is_file():
        raise HFModelError(f"{path}: not a local Hugging Face model directory (no config.json)")
    before = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        with _quiet(transformers):
            hf = AutoModelForCausalLM.from_pretrained(p).eval()
        try:
            tok = AutoTokenizer.from_pretrained(p)
        except Exception as exc:                      # transformers raises many kinds here
            raise HFModelError(f"{path}: the bridge needs the model's tokenizer, which did not load "
                               f"({type(exc).__name__}: {exc})") from exc
        bridge = TransformerBridge.boot_transformers(str(p), hf_model=hf, tokenizer=tok, device=device)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return bridge.eval()


__all__ = ["load_bridge", "to_hooked_transformer", "from_hooked_transformer", "to_tl_state_dict", "from_tl_state_dict"]
