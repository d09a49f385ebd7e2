"""Conditional zero-ablation against a forward pass written out with position-dependent weights."""
import math

import pytest
import torch

from wtc.explain.conditional import conditional_kl, is_local, zeroed_at
from wtc.models import Transformer, TransformerConfig
from wtc.models.transformer import abstopk

MATRICES = ["embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q", "blocks.0.attn.W_K", "blocks.0.attn.W_V",
            "blocks.0.attn.W_O", "blocks.0.mlp.W_in", "blocks.0.mlp.W_out", "blocks.1.attn.W_Q", "blocks.1.attn.W_K",
            "blocks.1.attn.W_V", "blocks.1.attn.W_O", "blocks.1.mlp.W_in", "blocks.1.mlp.W_out", "unembed.W_U"]


def _model(normalization=None, seed=0):
    cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=11, n_ctx=7,
                            normalization=normalization, mlp_abstopk=0.5 if normalization == "RMS" else None)
    model = Transformer(cfg, seed=seed).double()
    with torch.no_grad():                          # nonzero biases, so they are exercised too
        for n, p in model.named_parameters():
            if n.split(".")[-1].startswith("b_"):
                p.normal_(0, 0.3)
    return model.eval()


def reference_logits(model, tokens, name, index, mask):
    """The forward pass with W[name] replaced, at each (b, t) where mask holds, by a copy whose
    entry `index` is zero: every matrix is expanded to one copy per position."""
    B, T = tokens.shape
    params = dict(model.named_parameters())

    def at(key):                                   # (B, T, *shape): the weight used at each position
        W = params[key].detach().expand(B, T, *params[key].shape).clone()
        if key == name:
            W[(slice(None), slice(None)) + tuple(index)] *= (~mask).double()
        return W

    pos = torch.arange(T)
    WE, Wpos = at("embed.W_E"), at("pos_embed.W_pos")
    b_idx, t_idx = torch.meshgrid(torch.arange(B), pos, indexing="ij")
    x = WE[b_idx, t_idx, tokens] + Wpos[b_idx, t_idx, t_idx]               # (B, T, D)
    for layer, block in enumerate(model.blocks):
        a, pre = f"blocks.{layer}.attn.", f"blocks.{layer}."
        h = block.ln1(x)
        q = torch.einsum("btd,bthde->bthe", h, at(a + "W_Q")) + block.attn.b_Q
        k = torch.einsum("btd,bthde->bthe", h, at(a + "W_K")) + block.attn.b_K
        v = torch.einsum("btd,bthde->bthe", h, at(a + "W_V")) + block.attn.b_V
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~(pos[:, None] >= pos[None, :]), float("-inf"))
        z = torch.einsum("bhqk,bkhe->bqhe", scores.softmax(-1), v)
        x = x + torch.einsum("bthe,bthed->btd", z, at(a + "W_O")) + block.attn.b_O
        if block.has_mlp:
            h2 = block.ln2(x)
            post = block.mlp.act(torch.einsum("btd,btdm->btm", h2, at(pre + "mlp.W_in")) + block.mlp.b_in)
            if block.mlp.abstopk is not None:          # the model's own AbsTopK (tested in test_sparse)
                post = abstopk(post, block.mlp.abstopk)
            x = x + torch.einsum("btm,btmd->btd", post, at(pre + "mlp.W_out")) + block.mlp.b_out
    return torch.einsum("btd,btdv->btv", model.final_hidden(x), at("unembed.W_U")) + model.unembed.b_U


def _kl(clean, other):
    p = torch.log_softmax(clean, -1)
    q = torch.log_softmax(other, -1)
    return (p.exp() * (p - q)).sum(-1)


@pytest.mark.parametrize("normalization", [None, "LN", "RMS"])
@pytest.mark.parametrize("name", MATRICES)
def test_conditional_ablation_equals_position_dependent_weights(name, normalization, rng):
    model = _model(normalization, seed=int(rng.integers(1000)))
    tokens = torch.from_numpy(rng.integers(0, 11, (3, 7)))
    W = dict(model.named_parameters())[name]
    index = tuple(int(rng.integers(s)) for s in W.shape)
    if name == "embed.W_E":                        # a token that occurs, so the test has something to see
        index = (int(tokens[0, 2]), index[1])
    mask = torch.from_numpy(rng.random((3, 7)) < 0.5)
    with torch.no_grad():
        clean = model(tokens)
        torch.testing.assert_close(reference_logits(model, tokens, name, index, torch.zeros_like(mask)), clean,
                                   rtol=1e-10, atol=1e-10)
        expected = _kl(clean, reference_logits(model, tokens, name, index, mask))
        with zeroed_at(model, name, index, mask, tokens):
            got_logits = model(tokens)
        torch.testing.assert_close(got_logits, reference_logits(model, tokens, name, index, mask), rtol=1e-10,
                                   atol=1e-10)
        per = conditional_kl(model, tokens, name, index, mask, per_position=True)
        torch.testing.assert_close(per, expected.clamp_min(0), rtol=1e-8, atol=1e-12)
        # everywhere = the weight zeroed (brute force)
        full = torch.ones_like(mask)
        total = conditional_kl(model, tokens, name, index, full)
        saved = W.detach()[index].clone()
        W.data[index] = 0
        brute = _kl(clean, model(tokens)).clamp_min(0).sum()
        W.data[index] = saved
        torch.testing.assert_close(total, brute, rtol=1e-8, atol=1e-12)
        # the additive shortcut is exact exactly where it is claimed to be
        if is_local(model, name):
            kl_all = conditional_kl(model, tokens, name, index, full, per_position=True)
            torch.testing.assert_close(conditional_kl(model, tokens, name, index, mask), kl_all[mask].sum(),
                                       rtol=1e-8, atol=1e-12)


def test_several_masks_run_as_one_batch():
    model = _model()
    tokens = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(0))
    masks = [torch.rand(2, 7, generator=torch.Generator().manual_seed(i)) < 0.5 for i in range(3)]
    together = conditional_kl(model, tokens, "blocks.0.attn.W_K", (1, 3, 2), masks)
    apart = torch.stack([conditional_kl(model, tokens, "blocks.0.attn.W_K", (1, 3, 2), m) for m in masks])
    torch.testing.assert_close(together, apart, rtol=1e-10, atol=1e-14)


def test_bad_arguments_are_named():
    model = _model()
    tokens = torch.zeros(2, 7, dtype=torch.long)
    with pytest.raises(KeyError, match="supports"):
        conditional_kl(model, tokens, "blocks.0.ln1.w", (0,), torch.ones(2, 7, dtype=torch.bool))
    with pytest.raises(IndexError, match="out of range"):
        conditional_kl(model, tokens, "unembed.W_U", (99, 0), torch.ones(2, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="shaped like the tokens"):
        conditional_kl(model, tokens, "unembed.W_U", (0, 0), torch.ones(3, 7, dtype=torch.bool))
