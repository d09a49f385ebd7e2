"""wtc.hooks: named hook points, the Hooked root API, hooking any module by path."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from wtc.dt import DTConfig, DiscreteTransformer
from wtc.errors import HookError, HookNameError, HookTypeError, WtcError
from wtc.hooks import HookPoint, has_hooks, hook_modules
from wtc.models import Transformer, TransformerConfig


def small(normalization="LN", seed=0):
    cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=7, n_ctx=6,
                            normalization=normalization)
    return Transformer(cfg, seed=seed).double()


def tokens(seed=0):
    return torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(seed))


def dt():
    return DiscreteTransformer(DTConfig(n_layers=2, n_heads=1, n_mlps=1, replicas=2), seq_len=5)


@pytest.mark.parametrize("make", [small, dt])
def test_names_are_the_dotted_module_paths(make):
    model = make()
    paths = [n for n, m in model.named_modules() if isinstance(m, HookPoint)]
    assert list(model.hook_dict) == paths and paths
    assert [p.name for p in model.hook_points()] == paths      # named at construction
    assert model.blocks[1].attn.hook_pattern.name == "blocks.1.attn.hook_pattern"
    assert "blocks.1.attn.hook_pattern" in repr(model)


def test_transformer_blocks_have_attn_out_and_mlp_out():
    model = small()
    _, cache = model.run_with_cache(tokens())
    for l in range(2):
        torch.testing.assert_close(cache[f"blocks.{l}.hook_attn_out"],
                                   cache[f"blocks.{l}.hook_resid_mid"] - cache[f"blocks.{l}.hook_resid_pre"])
        torch.testing.assert_close(cache[f"blocks.{l}.hook_mlp_out"],
                                   cache[f"blocks.{l}.hook_resid_post"] - cache[f"blocks.{l}.hook_resid_mid"])
    assert cache["blocks.0.hook_attn_out"].shape == (3, 6, 8)
    attn_only = Transformer(TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=None, d_vocab=7,
                                              n_ctx=6))
    assert "blocks.0.hook_attn_out" in attn_only.hook_dict and "blocks.0.hook_mlp_out" not in attn_only.hook_dict


def test_replacing_attn_out_and_mlp_out_changes_the_logits_as_expected():
    model, x = small(), tokens()
    zero = lambda value, hook: torch.zeros_like(value)                         # noqa: E731
    # zeroing block 0's attention output is the model with W_O and b_O zeroed
    got = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_attn_out", zero)])
    want = functional_call(model, {"blocks.0.attn.W_O": torch.zeros_like(model.blocks[0].attn.W_O),
                                   "blocks.0.attn.b_O": torch.zeros_like(model.blocks[0].attn.b_O)}, (x,))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, model(x))
    # without the last MLP's output the logits are the unembedded resid_mid of the last block
    _, cache = model.run_with_cache(x)
    got = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_mlp_out", zero)])
    torch.testing.assert_close(got, model.unembed(model.final_hidden(cache["blocks.1.hook_resid_mid"])),
                               rtol=1e-12, atol=1e-12)
    # doubling it adds the MLP output once more before the final norm
    twice = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_mlp_out", lambda value, hook: 2 * value)])
    resid = cache["blocks.1.hook_resid_post"] + cache["blocks.1.hook_mlp_out"]
    torch.testing.assert_close(twice, model.unembed(model.final_hidden(resid)), rtol=1e-12, atol=1e-12)
    assert not has_hooks(model)


def test_cache_equals_a_manual_forward_hook_capture():
    model, x = small("RMS"), tokens(1)
    manual = {}
    handles = [m.register_forward_hook(lambda mod, i, o, n=n: manual.__setitem__(n, o.detach().clone()))
               for n, m in model.named_modules() if isinstance(m, HookPoint)]
    logits = model(x)
    for h in handles:
        h.remove()
    out, cache = model.run_with_cache(x)
    torch.testing.assert_close(out, logits, rtol=0, atol=0)
    assert cache.keys() == manual.keys()
    for n in manual:
        torch.testing.assert_close(cache[n], manual[n], rtol=0, atol=0)
        assert not cache[n].requires_grad


def test_names_filter_forms():
    model, x = small(), tokens()
    assert len(model.run_with_cache(x)[1]) == len(model.hook_dict)
    assert set(model.run_with_cache(x, names_filter="blocks.0.hook_resid_post")[1]) == {"blocks.0.hook_resid_post"}
    both = ["blocks.1.attn.hook_pattern", "hook_embed"]
    assert set(model.run_with_cache(x, names_filter=both)[1]) == set(both)
    assert set(model.run_with_cache(x, names_filter=tuple(both))[1]) == set(both)
    got = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_pattern"))[1]
    assert set(got) == {"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"}
    with pytest.raises(HookNameError, match="hook_patern") as err:
        model.run_with_cache(x, names_filter="blocks.0.attn.hook_patern")
    assert isinstance(err.value, KeyError) and isinstance(err.value, WtcError)
    assert "blocks.0.attn.hook_pattern" in str(err.value)               # the near miss is named
    with pytest.raises(HookError, match="names_filter"):
        model.run_with_cache(x, names_filter=3)
    assert not has_hooks(model)


def test_hooks_are_removed_on_exit_and_after_an_exception():
    model, x = small(), tokens()
    seen = []
    with model.hooks([("blocks.0.hook_resid_pre", lambda v, hook: seen.append(hook.name))]):
        model(x)
        assert model.blocks[0].hook_resid_pre.has_hooks
    assert seen == ["blocks.0.hook_resid_pre"] and not has_hooks(model)
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks([(lambda n: "resid" in n, lambda v, hook: None)]):
            assert all(model.hook_dict[n].has_hooks for n in model.hook_dict if "resid" in n)
            raise RuntimeError("boom")
    assert not has_hooks(model)
    with pytest.raises(HookNameError):                       # a bad name attaches nothing
        with model.hooks([("hook_embed", lambda v, hook: None), ("nope", lambda v, hook: None)]):
            pass
    assert not has_hooks(model)


def test_add_hook_reset_hooks_and_plain_hooks_coexist():
    model, x = small(), tokens()
    clean = model(x)
    plain = []
    handle = model.hook_embed.register_forward_hook(lambda m, i, o: plain.append(1))
    model.add_hook("hook_embed", lambda v, hook: 0 * v)
    model.add_hook(lambda n: n == "hook_pos_embed", lambda v, hook: 0 * v)
    blank = model(x)
    assert not torch.allclose(blank, clean) and plain == [1]
    model.reset_hooks()                                   # removes add_hook's, keeps the plain one
    torch.testing.assert_close(model(x), clean, rtol=0, atol=0)
    assert plain == [1, 1] and model.hook_embed.has_hooks
    handle.remove()
    assert not model.hook_embed.has_hooks and not has_hooks(model)


def test_has_hooks_counts_pre_hooks_and_any_module():
    point, seq = HookPoint(), nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert not point.has_hooks and not has_hooks(seq)
    h = point.register_forward_pre_hook(lambda m, a: None)
    g = seq[1].register_forward_hook(lambda m, i, o: None)
    assert point.has_hooks and has_hooks(seq) and not has_hooks(seq[0])
    h.remove(), g.remove()
    assert not point.has_hooks and not has_hooks(seq)


class _Pair(nn.Module):
    """A Hugging Face style layer: returns (hidden, extra)."""

    def forward(self, x, scale=1.0):
        return (2 * x * scale, torch.ones(1))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = _Pair()
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        hidden, extra = self.layer(x, scale=1.0)
        return self.head(hidden) + extra


def test_hook_modules_captures_and_replaces_tuple_outputs_and_inputs():
    net, x = _Net().double(), torch.randn(4, 3, dtype=torch.float64)
    clean = net(x)
    seen = {}
    with hook_modules(net, [("layer", lambda v, m: seen.__setitem__("out", v))]), \
            hook_modules(net, [("head", lambda v, m: seen.__setitem__("in", v))], on="input"):
        net(x)
    torch.testing.assert_close(seen["out"], 2 * x)
    torch.testing.assert_close(seen["in"], 2 * x)
    with hook_modules(net, [("layer", lambda v, m: torch.zeros_like(v))]):
        out = net.layer(x)
        assert type(out) is tuple and torch.equal(out[0], torch.zeros_like(x)) and torch.equal(out[1], torch.ones(1))
        torch.testing.assert_close(net(x), (net.head.bias + 1).expand(4, 2))
    want = net.head(x) + 1                                   # head reads 2x / 2
    with hook_modules(net, [("head", lambda v, m: v / 2)], on="input"):
        torch.testing.assert_close(net(x), want)
    torch.testing.assert_close(net(x), clean, rtol=0, atol=0)
    assert not has_hooks(net)


def test_hook_modules_errors():
    net, x = _Net(), torch.randn(4, 3)
    with pytest.raises(KeyError, match="no module named 'nope'"):
        with hook_modules(net, [("nope", lambda v, m: None)]):
            pass
    with pytest.raises(HookError, match="on must be"):
        with hook_modules(net, [("head", lambda v, m: None)], on="both"):
            pass
    dict_out = nn.ModuleDict({"d": nn.Identity()})
    dict_out.forward = lambda x: {"a": x}
    with pytest.raises(TypeError, match="not a tensor"):
        with hook_modules(dict_out, [("", lambda v, m: None)]):
            dict_out(x)
    assert issubclass(HookTypeError, HookError)
    assert not has_hooks(net) and not has_hooks(dict_out)


def test_dt_run_with_cache_wraps_the_mixin():
    model = dt()
    x = np.random.default_rng(0).random((4, 5))
    y, cache = model.run_with_cache(x, replica=1)
    assert y.shape == (4, 5) and np.allclose(y, model.predict(x, replica=1))
    assert "blocks.0.attn.hook_pattern" in cache and cache["hook_stream"].shape[0] == 1
    y2, some = model.run_with_cache(x, replica=1, names_filter="hook_stream")
    assert list(some) == ["hook_stream"] and np.array_equal(y, y2)
    torch.testing.assert_close(some["hook_stream"], cache["hook_stream"], rtol=0, atol=0)
    assert not has_hooks(model)


def test_dt_fuses_only_when_nobody_listens(monkeypatch):
    """WTC_KERNELS=triton: a listener at hook_scores / hook_pattern / hook_pre (a plain torch hook
    or one added through wtc.hooks) sends the DT to the reference path; elsewhere it does not."""
    pytest.importorskip("triton")
    from wtc import kernels
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setenv("WTC_KERNELS", "triton")
    if dev == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = {"route": 0, "mlp_bank": 0}

    def counted(name, op):
        def wrapper(*args, **kw):
            calls[name] += 1
            return op(*args, **kw)
        return wrapper

    for name in calls:
        monkeypatch.setattr(kernels, name, counted(name, getattr(kernels, name)))
    model = DiscreteTransformer(DTConfig(n_heads=1, n_mlps=1, replicas=1), seq_len=3).to(dev)
    x = torch.rand(2, 3, 1, device=dev)

    def run(*names):
        calls.update(route=0, mlp_bank=0)
        with torch.no_grad():
            model.run_with_hooks(x, fwd_hooks=[(name, lambda v, hook: None) for name in names])
        return dict(calls)

    assert run() == {"route": 1, "mlp_bank": 1}
    assert run("hook_stream", "blocks.0.attn.hook_z") == {"route": 1, "mlp_bank": 1}
    assert run("blocks.0.attn.hook_scores") == {"route": 0, "mlp_bank": 1}
    assert run("blocks.0.attn.hook_pattern") == {"route": 0, "mlp_bank": 1}
    assert run("blocks.0.mlp.hook_pre") == {"route": 1, "mlp_bank": 0}
    handle = model.blocks[0].attn.hook_pattern.register_forward_pre_hook(lambda m, a: None)
    assert run() == {"route": 0, "mlp_bank": 1}
    handle.remove()
    assert run() == {"route": 1, "mlp_bank": 1}


def test_ace_reads_a_tuple_output_layer():
    from wtc.ace.core import activations_and_jacobians
    net, x = _Net().double(), torch.randn(4, 3, dtype=torch.float64)
    H, J = activations_and_jacobians(net, x, "layer", lambda out: out, position=None)
    torch.testing.assert_close(H, 2 * x)
    torch.testing.assert_close(J, net.head.weight.detach().expand(4, 2, 3))
