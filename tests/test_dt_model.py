import numpy as np
import pytest
import torch

from wtc.dt import ConfigError, DTConfig, DiscreteTransformer
from wtc.dt.selection import EVAL, Sampling


def make(rng, replicas=2, **kw):
    """A random model whose content and positional scores are all non-trivial (as after training)."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    model = DiscreteTransformer(DTConfig(replicas=replicas, **kw), seq_len=7, n_inputs=2)
    with torch.no_grad():
        for block in model.blocks:
            if block.attn is not None:
                for p in (block.attn.W, block.attn.u, block.attn.rel, block.attn.abs):
                    p.normal_()
    return model


def test_stream_names_and_shapes(rng):
    model = make(rng, n_layers=2, n_heads=(2, 1), n_agg_heads=(1, 0), n_mlps=(1, 2))
    assert model.variable_names == ["x0", "x1", "pos", "L0.h0", "L0.h1", "L0.a0", "L0.m0", "L1.h0", "L1.m0", "L1.m1"]
    y, stats = model(torch.rand(5, 7, 2), Sampling.anneal(2.0, gumbel=True, straight_through=False, generator=None))
    assert y.shape == (2, 5, 7, 1)


@pytest.mark.parametrize("sampling", ["soft", "eval"])
def test_causal_masking(rng, sampling):
    """Perturbing x_s never changes outputs at t < s (pads and keys after t are masked)."""
    model = make(rng, n_layers=2, n_heads=2, n_agg_heads=1, n_mlps=2)
    x = torch.rand(4, 7, 2)
    mode = Sampling(tau=0.7, hard=False) if sampling == "soft" else EVAL
    if sampling == "eval":
        model.freeze()
    model.eval()
    base, _ = model(x, mode)
    for s in range(7):
        x2 = x.clone()
        x2[:, s] += torch.randn(4, 2) * 3
        out, _ = model(x2, mode)
        torch.testing.assert_close(out[:, :, :s], base[:, :, :s], rtol=0, atol=0)
        if s < 6:
            assert not torch.equal(out[:, :, s:], base[:, :, s:])


def test_hard_limit_rows_are_one_hot(rng):
    """As tau -> 0 the softmax rows become one-hot at the argmax of the scores."""
    model = make(rng, n_layers=1, n_heads=3, n_mlps=1)
    x = torch.rand(6, 7, 2)
    cache = {}
    keep = [("blocks.0.attn.hook_pattern", lambda p, hook: cache.__setitem__("p", p)),
            ("blocks.0.attn.hook_scores", lambda s, hook: cache.__setitem__("s", s))]
    for tau in (10.0, 1e-3, 1e-5):
        model.run_with_hooks(x, Sampling(tau=tau, hard=False, noise=False), fwd_hooks=keep)
        p, s = cache["p"], cache["s"]
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
        top2 = s.topk(2, dim=-1).values
        separated = (top2[..., 0] - top2[..., 1]) > 50 * tau      # rows that are not near-ties
        if tau < 1:
            assert separated.float().mean() > (0.5 if tau > 1e-4 else 0.9)
            assert torch.all(p.max(-1).values[separated] > 1 - 1e-6)
            assert torch.equal(p.argmax(-1)[separated], s.argmax(-1)[separated])
        else:
            assert torch.all(p.max(-1).values < 0.9)


def test_eval_pattern_is_argmax_of_scores(rng):
    model = make(rng, n_layers=1, n_heads=2, n_mlps=0)
    cache = {}
    model.run_with_hooks(torch.rand(5, 7, 2), EVAL,
                         fwd_hooks=[("blocks.0.attn.hook_scores", lambda s, hook: cache.__setitem__("s", s)),
                                    ("blocks.0.attn.hook_pattern", lambda p, hook: cache.__setitem__("p", p))])
    one_hot = torch.zeros_like(cache["s"]).scatter_(-1, cache["s"].argmax(-1, keepdim=True), 1.0)
    assert torch.equal(cache["p"], one_hot)


def test_selection_freezing(rng):
    model = make(rng, n_layers=2, n_heads=2, n_mlps=2)
    before = model.structure(1)
    model.freeze()
    assert all(sel.frozen for sel in model.selectors())
    with torch.no_grad():
        for sel in model.selectors():
            sel.logits.normal_()      # logits no longer matter once frozen
    assert model.structure(1) == before
    for sel in model.selectors():
        choice = sel(Sampling(tau=5.0, hard=False, noise=True))   # noise and tau are ignored
        assert torch.equal(choice.index, sel.frozen_index) and choice.weights is None
        values = torch.randn(2, 3, len(sel.variable_names))
        expected = torch.stack([values[r][:, sel.frozen_index[r]] for r in range(2)])
        assert torch.equal(choice.read(values), expected)
        assert not sel.logits.requires_grad


def test_read_masks_steer_selections(rng):
    model = make(rng, n_layers=1, n_heads=2, n_mlps=2, read={"L0.m*": ["L0.h*"], "L0.h1.v": ["x1"]})
    attn_sel, mlp_sel = model.blocks[0].attn.select, model.blocks[0].mlp.select
    names = mlp_sel.variable_names
    allowed = [n for n in names if n.startswith("L0.h")]
    for s in range(len(mlp_sel.slot_names)):
        assert [names[v] for v in range(len(names)) if mlp_sel.mask[s, v]] == allowed
    assert model.structure(0)["L0.h1.v"] == "x1"
    # position is not readable by query/key slots unless qk_position=True
    q = attn_sel.slot_names.index("L0.h0.q")
    assert not attn_sel.mask[q, attn_sel.variable_names.index("pos")]
    with pytest.raises(ValueError, match="no readable variable"):
        make(rng, n_layers=1, n_heads=1, n_mlps=1, read={"L0.m0.in0": ["nothing*"]})


def test_replica_slicing_preserves_predictions(rng):
    model = make(rng, replicas=3, n_layers=2, n_heads=2, n_mlps=2)
    model.freeze()
    x = rng.uniform(0, 1, (9, 7, 2))
    all_preds = model.predict(x, replica=-1)
    for r in range(3):
        np.testing.assert_allclose(model.replica(r).predict(x), all_preds[r], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="replicas"):
        model.predict(x)
    with pytest.raises(IndexError):
        model.replica(3)


def test_predict_rejects_bad_inputs(rng):
    model = make(rng, replicas=1, n_layers=1)
    with pytest.raises(ValueError, match=r"expected \(n, 7, 2\)"):
        model.predict(np.zeros((3, 6, 2)))
    with pytest.raises(ValueError, match="NaN"):
        model.predict(np.full((3, 7, 2), np.nan))


@pytest.mark.parametrize("kw,message", [
    (dict(n_layers=0), "n_layers"), (dict(n_heads=(1, 2, 3)), "n_heads"), (dict(tau_end=20.0), "tau_end"),
    (dict(mlp_activation="swish"), "mlp_activation"), (dict(n_heads=0, n_mlps=0), "no modules"),
    (dict(lr=-1.0), "lr"), (dict(read={"L0.m0": "x"}), "read"), (dict(steps=0), "steps"),
])
def test_config_validation(kw, message):
    with pytest.raises(ConfigError, match=message):
        DTConfig(**kw)


def test_config_replace_follows_layers():
    cfg = DTConfig(n_heads=3, n_mlps=2).replace(n_layers=2, n_heads=(3, 0))
    assert cfg.n_heads == (3, 0) and cfg.n_mlps == (2, 2) and cfg.n_agg_heads == (0, 0)
    from wtc.dt.config import LADDER
    for i in range(2 * len(LADDER)):    # every rung of the restart ladder is a valid configuration
        DTConfig().rung(i)[1].check_size(10, 1)


def test_restarts_climb_the_ladder_only_when_growing():
    base = DTConfig(mlp_hidden=16)
    labels = [base.rung(i)[0] for i in range(8)]
    assert labels[0] == "as configured" and labels[7] == labels[0] and len(set(labels)) == 7
    assert base.rung(0)[1] == base
    assert base.rung(1)[1].mlp_inputs == 3 and base.rung(1)[1].mlp_hidden == 16   # user settings kept
    assert base.rung(3)[1].n_layers == 2
    fixed = base.replace(grow=False)
    assert all(fixed.rung(i)[1] == fixed for i in range(5))


def test_the_first_pass_skips_a_step_that_changes_nothing():
    """A base that already has aggregate heads gets nothing new from "+ aggregate heads": the first
    pass goes on to the two-layer steps; later passes cycle the whole ladder (new seeds)."""
    from wtc.dt.config import LADDER
    base = DTConfig(n_agg_heads=2)
    first = [base.rung(i) for i in range(6)]
    assert [label for label, _ in first] == ["as configured", "3-input, 2-hidden-layer sub-MLPs",
                                             "two layers: chained sub-MLPs", "two layers: heads in both",
                                             "two layers: prefix extremes of sub-MLPs",
                                             "two layers: prefix means of sub-MLPs"]
    assert all(a != b for i, (_, a) in enumerate(first) for _, b in first[:i])     # each one new
    assert [base.rung(6 + k)[0] for k in range(len(LADDER))] == [label for label, _ in LADDER]
    assert base.rung(6 + 2)[1] == base                                               # the step, as it was


def test_a_rung_without_pointer_heads_drops_only_the_default_ones():
    """The prefix-statistics rung has no pointer heads: a base with the default three loses them; a
    base grown or set to more keeps them in the first layer; recency heads stay in the last."""
    label = "two layers: prefix means of sub-MLPs"

    def rung(base):
        return next(c for lab, c in (base.rung(i) for i in range(9)) if lab == label)

    assert rung(DTConfig()).n_heads == (0, 0) and rung(DTConfig(n_heads=2)).n_heads == (0, 0)
    assert rung(DTConfig(n_heads=5)).n_heads == (5, 0)
    recent = rung(DTConfig(n_heads=1, n_recent_heads=1))
    assert recent.n_heads == (0, 1) and recent.n_recent_heads == (0, 1)
    assert rung(DTConfig(mlp_inputs=4)).mlp_inputs == 4                               # never fewer inputs
    assert rung(DTConfig()).steps == 6 * DTConfig().steps and rung(DTConfig(steps=50)).steps == 300


def test_config_roundtrip():
    cfg = DTConfig(n_layers=2, n_heads=(1, 2), read={"L0.m*": ["x"]})
    assert DTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown"):
        DTConfig.from_dict({"n_layer": 2})


def test_depth2_submlp_represents_max_of_three_exactly(rng):
    """max(a, b, c) = a + relu(b - a) + relu(c - a - relu(b - a)): a ReLU of ReLUs, so it needs the
    second hidden layer (W_mid maps first-layer unit h to second-layer unit g as W_mid[g, h])."""
    from wtc.dt.submlp import SubMLPs
    mlp = SubMLPs(0, 1, 1, 3, 8, "relu+silu", ["a", "b", "c"], lambda s, v: torch.ones(len(s), len(v), dtype=torch.bool),
                  depth=2)
    with torch.no_grad():
        for p in mlp.parameters_of_map():
            p.zero_()
        W1 = mlp.W1[0, 0]                                   # (hidden, k); units 0-3 ReLU, 4-7 SiLU
        W1[0] = torch.tensor([-1.0, 1.0, 0.0])              # relu(b - a)
        W1[1] = torch.tensor([-1.0, 0.0, 1.0])              # relu(c - a)
        W1[2] = torch.tensor([1.0, 0.0, -1.0])              # relu(a - c)
        Wm = mlp.W_mid[0, 0]
        Wm[0, 1], Wm[0, 2], Wm[0, 0] = 1.0, -1.0, -1.0      # relu(c - a - relu(b - a))
        Wm[1, 0] = 1.0                                      # relu(relu(b - a)) passes u0 on
        mlp.W2[0, 0, 0], mlp.W2[0, 0, 1] = 1.0, 1.0
        mlp.skip[0, 0, 0] = 1.0                             # + a
    x = torch.as_tensor(rng.integers(0, 100, (500, 3)), dtype=torch.float32)
    y = mlp.evaluate(x[None, :, None, :])[0, :, 0]
    assert torch.equal(y, x.max(dim=1).values)
    with pytest.raises(ValueError, match="depth"):
        SubMLPs(0, 1, 1, 3, 8, "relu", ["a"], lambda s, v: torch.ones(len(s), len(v), dtype=torch.bool), depth=3)
    with pytest.raises(ConfigError, match="mlp_depth"):
        DTConfig(mlp_depth=3)
