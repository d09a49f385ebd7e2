"""TransformerLens interop (optional dependency: skipped when transformer_lens is not installed)."""
import pytest
import torch

tl = pytest.importorskip("transformer_lens")

from wtc.scan import scan  # noqa: E402
from wtc.models import Transformer, TransformerConfig  # noqa: E402
from wtc.models.tl import from_hooked_transformer, to_hooked_transformer  # noqa: E402

try:
    from transformer_lens import HookedTransformer  # noqa: F401
    HOOKED = True
except ImportError:            # TransformerLens 4 removed it (its TransformerBridge: test_transformer_bridge)
    HOOKED = False
needs_hooked = pytest.mark.skipif(not HOOKED, reason="HookedTransformer is in TransformerLens 3 only")


@pytest.mark.skipif(HOOKED, reason="TransformerLens 3 has HookedTransformer")
def test_without_hooked_transformer_the_conversion_says_what_to_install():
    model = Transformer(TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=7, n_ctx=6))
    with pytest.raises(ImportError, match=r"removed in TransformerLens 4 \(installed: 4\..*load_bridge"):
        to_hooked_transformer(model)


@needs_hooked
@pytest.mark.parametrize("normalization", [None, "LN"])
def test_roundtrip_with_hooked_transformer(normalization):
    cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=7, n_ctx=6,
                            normalization=normalization)
    model = Transformer(cfg, seed=0).double()
    tokens = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(0))
    hooked = to_hooked_transformer(model)
    torch.testing.assert_close(hooked(tokens), model(tokens), rtol=1e-10, atol=1e-10)
    back = from_hooked_transformer(hooked)
    torch.testing.assert_close(back(tokens), model(tokens), rtol=0, atol=0)
    _, ours = model.run_with_cache(tokens)
    _, theirs = hooked.run_with_cache(tokens)
    for name in ("blocks.0.attn.hook_pattern", "blocks.1.mlp.hook_post", "blocks.1.hook_resid_post",
                 "blocks.0.hook_attn_out", "blocks.1.hook_mlp_out"):
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-10, atol=1e-10)


@needs_hooked
def test_scan_of_a_hooked_transformer_equals_the_wtc_scan():
    cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=7, n_ctx=6)
    model = Transformer(cfg, seed=1).double()
    hooked = to_hooked_transformer(model)
    tokens = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(1))
    names = ["blocks.0.attn.W_K", "blocks.1.mlp.W_in", "unembed.W_U"]
    a = scan(model, tokens, params=names, progress=False)
    b = scan(hooked, tokens, params=names, progress=False)
    for n in names:
        torch.testing.assert_close(b.total_kl[n], a.total_kl[n], rtol=1e-7, atol=1e-12)


@needs_hooked
@pytest.mark.parametrize("normalization,act_fn", [("LN", "gelu"), (None, "relu"), ("LN", "gelu_new")])
def test_hooked_transformer_scan_equals_its_naive_loop(monkeypatch, normalization, act_fn):
    """A HookedTransformer wtc can express is scanned through its wtc twin (the structured path);
    one it cannot (gelu_new) through the generic path; both equal the naive loop on the TL model."""
    from wtc.scan import suffix
    from wtc.scan.reference import naive_position_kl
    calls = []
    original = suffix.Suffix.kl
    monkeypatch.setattr(suffix.Suffix, "kl", lambda self, *a: calls.append(1) or original(self, *a))
    tl_cfg = tl.HookedTransformerConfig(n_layers=2, d_model=8, n_ctx=6, d_head=4, n_heads=2, d_mlp=12, d_vocab=7,
                                        act_fn=act_fn, normalization_type=normalization, dtype=torch.float64, seed=3)
    hooked = tl.HookedTransformer(tl_cfg).eval()
    tokens = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(4))
    names = ["embed.W_E", "blocks.0.attn.W_V", "blocks.0.mlp.W_out", "blocks.1.attn.W_Q"]
    res = scan(hooked, tokens, params=names, progress=False, batch=4)
    for name in names:
        want = naive_position_kl(hooked, tokens, name)
        got = torch.stack([res.position_kl(name, i) for i in range(len(want))])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-9)
    assert bool(calls) == (act_fn != "gelu_new")
