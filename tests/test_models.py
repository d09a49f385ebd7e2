"""wtc.models.Transformer options and the TransformerLens state-dict layout (no TL needed)."""
import pytest
import torch

from wtc.models import Transformer, TransformerConfig
from wtc.models import io as model_io
from wtc.models.tl import from_tl_state_dict, to_tl_state_dict


def _cfg(**kw):
    base = dict(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=11, n_ctx=7)
    return TransformerConfig(**{**base, **kw})


def _tokens(seed=0):
    return torch.randint(0, 11, (5, 7), generator=torch.Generator().manual_seed(seed))


def test_no_bias_model_has_zero_bias_buffers_and_no_bias_parameters(tmp_path):
    model = Transformer(_cfg(bias=False), seed=0).double()
    params = dict(model.named_parameters())
    assert not [n for n in params if n.split(".")[-1].startswith("b_")]
    assert all(float(v.abs().max()) == 0 for k, v in model.state_dict().items() if k.split(".")[-1].startswith("b_"))
    model_io.save(model, tmp_path / "m")
    back = model_io.load(tmp_path / "m")
    torch.testing.assert_close(back(_tokens()), model(_tokens()), rtol=0, atol=0)


@pytest.mark.parametrize("positions", [slice(6, 7), slice(2, 5), slice(None)])
def test_logits_at_equals_the_full_forward(positions):
    model = Transformer(_cfg(normalization="LN"), seed=1).double()
    x = _tokens(1)
    torch.testing.assert_close(model.logits_at(x, positions), model(x)[:, positions], rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="slice"):
        model.logits_at(x, 3)


def test_tl_state_dict_roundtrip_with_a_missing_mlp_and_no_biases():
    cfg = _cfg(mlp_layers=(1,), bias=False)
    model = Transformer(cfg, seed=2).double()
    state = to_tl_state_dict(model)
    for name in ("blocks.0.mlp.W_in", "blocks.0.mlp.b_in", "blocks.0.mlp.W_out", "blocks.0.mlp.b_out",
                 "blocks.0.attn.b_Q", "unembed.b_U"):
        assert name in state and float(state[name].abs().max()) == 0
    back = from_tl_state_dict(state, cfg)
    torch.testing.assert_close(back(_tokens()), model(_tokens()), rtol=0, atol=0)
    # a full model with the same state computes the same function (the zero MLP adds nothing)
    full = from_tl_state_dict(state, _cfg(bias=False))
    torch.testing.assert_close(full(_tokens()), model(_tokens()), rtol=1e-12, atol=1e-12)


def test_tl_state_dict_import_refuses_to_drop_nonzero_weights():
    cfg = _cfg(mlp_layers=(1,), bias=False)
    state = to_tl_state_dict(Transformer(cfg, seed=3))
    bad = dict(state, **{"blocks.0.mlp.W_in": torch.ones_like(state["blocks.0.mlp.W_in"])})
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp\.W_in"):
        from_tl_state_dict(bad, cfg)
    bad = dict(state, **{"blocks.1.attn.b_V": torch.ones_like(state["blocks.1.attn.b_V"])})
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.b_V"):
        from_tl_state_dict(bad, cfg)
    short = {k: v for k, v in state.items() if k != "unembed.W_U"}
    with pytest.raises(ValueError, match="lacks"):
        from_tl_state_dict(short, cfg)


def test_bad_bias_option_is_named():
    with pytest.raises(ValueError, match="bias"):
        _cfg(bias="no")
