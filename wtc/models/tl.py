"""Moving weights between wtc.models.Transformer and TransformerLens's HookedTransformer.

The parameter names are the same, so a state dict moves unchanged; only TL's buffers (masks,
IGNORE) are left out on the way back. TransformerLens is optional (pip install
transformer_lens==3.9.*, the last line with HookedTransformer) and imported only here.
"""
from __future__ import annotations


from wtc.models.transformer import Transformer, TransformerConfig


def _tl():
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as exc:
        raise ImportError("TransformerLens is not installed (optional: pip install 'transformer_lens==3.9.*')") from exc
    return HookedTransformer, HookedTransformerConfig


def to_hooked_transformer(model: Transformer):
    """A HookedTransformer computing the same logits as `model`."""
    HookedTransformer, HookedTransformerConfig = _tl()
    c = model.cfg
    if c.mlp_layers not in (tuple(range(c.n_layers)), ()):
        raise ValueError("TransformerLens has no per-layer MLP switch: export needs MLPs in all or no blocks")
    tl_cfg = HookedTransformerConfig(n_layers=c.n_layers, d_model=c.d_model, n_ctx=c.n_ctx, d_head=c.d_head,
                                     n_heads=c.n_heads, d_mlp=c.d_mlp, d_vocab=c.d_vocab, act_fn=c.act_fn,
                                     normalization_type=c.normalization, attn_only=not c.mlp_layers,
                                     positional_embedding_type="standard", dtype=next(model.parameters()).dtype)
    tl = HookedTransformer(tl_cfg)
    missing, unexpected = tl.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(not (k.endswith("IGNORE") or k.endswith(".mask")) for k in missing):
        raise ValueError(f"state dict mismatch with TransformerLens: missing {missing}, unexpected {unexpected}")
    return tl.eval()


def from_hooked_transformer(tl) -> Transformer:
    """A wtc Transformer with the weights of a (standard, LN or no-norm) HookedTransformer."""
    c = tl.cfg
    if c.positional_embedding_type != "standard" or c.normalization_type not in (None, "LN"):
        raise ValueError(f"only standard positions and LN/no normalization are supported, got "
                         f"{c.positional_embedding_type!r}, {c.normalization_type!r}")
    cfg = TransformerConfig(n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads, d_head=c.d_head,
                            d_mlp=None if c.attn_only else c.d_mlp, d_vocab=c.d_vocab, n_ctx=c.n_ctx,
                            act_fn=c.act_fn, normalization=c.normalization_type)
    model = Transformer(cfg).to(next(tl.parameters()).dtype)
    ours = set(model.state_dict())
    model.load_state_dict({k: v for k, v in tl.state_dict().items() if k in ours})
    return model.eval()


__all__ = ["to_hooked_transformer", "from_hooked_transformer"]
