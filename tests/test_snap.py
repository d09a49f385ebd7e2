"""Snapping pointer heads to the routing rules they nearly follow (wtc.dt.snap)."""
import numpy as np
import pytest
import torch

from wtc.dt import DTConfig
from wtc.dt.model import DiscreteTransformer
from wtc.dt.selection import EVAL, Sampling
from wtc.dt import snap
from wtc.dt.refine import _inputs_of
from wtc.dt.finish import refit_head
from wtc.extraction.routing_rules import Rule, candidate_rules, routed, rule_keys

T = 8


def frozen_model(x, y, replicas=2, n_heads=3, n_mlps=0, content_fraction=0.5, seed=0):
    torch.manual_seed(seed)
    m = DiscreteTransformer(DTConfig(replicas=replicas, n_heads=n_heads, n_mlps=n_mlps,
                                     content_fraction=content_fraction), seq_len=T, n_inputs=1, n_outputs=1)
    m.fit_normalization(x, y)
    xt = m.normalize_inputs(torch.tensor(x, dtype=torch.float32))
    with torch.no_grad():
        m(xt, Sampling.anneal(10.0, gumbel=False, straight_through=False), track_ranges="set")
    m.freeze()
    yt = m.normalize_targets(torch.tensor(y, dtype=torch.float32))
    return m, xt, yt, torch.ones_like(yt)


def data(hi, n=96, seed=0):
    x = np.random.default_rng(seed).integers(0, hi, size=(n, T, 1)).astype(float)
    return x, np.maximum.accumulate(x[..., 0], axis=1)[..., None]


@pytest.mark.parametrize("hi", [100, 3])     # 3: ties everywhere, pads tie with zeros
def test_every_rule_is_realised_exactly(hi):
    x, y = data(hi)
    m, xt, _, _ = frozen_model(x, y)
    attn = m.blocks[0].attn
    stream, unit = _inputs_of(m, attn, xt)
    values = stream[1].double().numpy()[:, :, 0]                                    # x, pads in front
    rules = [r for r in candidate_rules(T, ["x"]) if snap.realisable(r)]
    assert {r.kind for r in rules} == {"offset", "absolute", "window"}
    for rule in rules:
        snap.realise(attn, 1, 2, rule, 0 if rule.kind == "window" else None, unit)
        got = routed(values, snap._pointers(attn, unit)[1, :, 2].numpy(), attn.P)
        want = routed(values, rule_keys(rule, {"x": values}, attn.P, T), attn.P)
        assert np.array_equal(got, want), rule.describe()


def _fuzzy_prefix_max(m, unit, r=0, h=0, noise=3.0, seed=1):
    """Head h of replica r: a prefix argmax of x with its positional terms disturbed."""
    attn = m.blocks[0].attn
    snap.realise(attn, r, h, Rule("window", {"var": "x", "op": "max", "w": None, "real": True,
                                             "ties": "first", "end": 0}), 0, unit)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        attn.u[r, h] *= 0.004                     # weak content, noisy positions: a learned-looking argmax
        attn.rel[r, h] += noise * torch.randn(attn.rel.shape[-1], generator=g)
        attn.select.frozen_index[r, 2 * attn.H + h] = 0                              # routes x


def test_snap_turns_a_fuzzy_prefix_max_into_the_exact_one():
    x, y = data(100, n=256)
    m, xt, yt, valid = frozen_model(x, y)
    attn = m.blocks[0].attn
    _, unit = _inputs_of(m, attn, xt)
    _fuzzy_prefix_max(m, unit)
    stream, _ = _inputs_of(m, attn, xt)
    values = stream[0].double().numpy()[:, :, 0]
    rule = Rule("window", {"var": "x", "op": "max", "w": None, "real": True, "ties": "first", "end": 0})
    want = routed(values, rule_keys(rule, {"x": values}, attn.P, T), attn.P)
    before = routed(values, snap._pointers(attn, unit)[0, :, 0].numpy(), attn.P)
    rate = float((before == want).mean())
    assert 0.3 <= rate < 0.95                     # fuzzy, but a rule it mostly follows
    loss_before = snap._loss(m, xt, yt, valid)
    kept = snap.snap_heads(m, xt, yt, valid)
    refit_head(m, xt, yt, valid)                  # as the attempt does after snapping
    assert [(s.replica, s.head) for s in kept if s.replica == 0] == [(0, "L0.h0")]   # exact: no more snaps
    s0 = next(s for s in kept if s.replica == 0)
    assert "argmax of x over the whole prefix" in s0.rule and s0.rate == pytest.approx(rate)
    assert s0.loss_after < 1e-10 < s0.loss_before
    pred = m.predict(data(100, n=64, seed=7)[0], replica=0)                        # fresh sequences
    assert np.allclose(pred, data(100, n=64, seed=7)[1][..., 0], atol=1e-3)
    loss_after = snap._loss(m, xt, yt, valid)
    assert bool((loss_after <= loss_before * (1 + 1e-6) + 1e-12).all())            # no replica got worse


def test_nothing_is_snapped_when_a_replica_already_fits():
    x, y = data(100, n=128)
    m, xt, yt, valid = frozen_model(x, y)
    attn = m.blocks[0].attn
    _, unit = _inputs_of(m, attn, xt)
    snap.realise(attn, 1, 0, Rule("window", {"var": "x", "op": "max", "w": None, "real": True, "ties": "first",
                                             "end": 0}), 0, unit)
    with torch.no_grad():
        attn.select.frozen_index[1, 2 * attn.H] = 0
    _fuzzy_prefix_max(m, unit, r=0)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    assert snap.snap_heads(m, xt, yt, valid) == []
    for k, v in m.state_dict().items():
        if not k.startswith(("W_out", "b_out")):                                      # the head is refit
            assert torch.equal(v, state[k]), k


def test_a_snap_that_does_not_lower_the_loss_enough_is_undone(monkeypatch):
    x, y = data(100, n=128)
    m, xt, yt, valid = frozen_model(x, y)
    attn = m.blocks[0].attn
    _, unit = _inputs_of(m, attn, xt)
    _fuzzy_prefix_max(m, unit)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    tried = []
    real = snap.realise
    monkeypatch.setattr(snap, "realise", lambda *a: (tried.append(a[3]), real(*a)))
    monkeypatch.setattr(snap, "SNAP_GAIN", 0.0)     # no loss is below 0: every candidate is undone
    assert snap.snap_heads(m, xt, yt, valid) == []
    assert tried                                    # candidates were realised, then restored
    for k, v in m.state_dict().items():
        if not k.startswith(("W_out", "b_out")):
            assert torch.equal(v, state[k]), k


def test_a_minimum_head_drawn_onto_the_pads_snaps_to_the_real_keys():
    """Pads hold 0, the smallest value, so a learned prefix-min head routes them on most queries
    and agrees best with the rule that includes them (running_min); its twin over the real keys
    is tried too, and that one fits."""
    x = np.random.default_rng(0).integers(0, 100, size=(256, T, 1)).astype(float)
    y = np.minimum.accumulate(x[..., 0], axis=1)[..., None]
    m, xt, yt, valid = frozen_model(x, y)
    attn = m.blocks[0].attn
    _, unit = _inputs_of(m, attn, xt)
    with_pads = Rule("window", {"var": "x", "op": "min", "w": None, "real": False, "ties": "first", "end": 0})
    snap.realise(attn, 0, 0, with_pads, 0, unit)
    with torch.no_grad():
        attn.select.frozen_index[0, 2 * attn.H] = 0
        s = attn.scores(unit, attn.select(snap.EVAL))[0, :, 0]                   # (B, T, L)
        gap = s[..., : attn.P].max(-1).values - s[..., attn.P:].max(-1).values       # pads' lead per query
        attn.abs[0, 0, : attn.P] -= float(gap.quantile(0.3))                     # pads win on ~70% of queries
    stream, _ = _inputs_of(m, attn, xt)
    values = stream[0].double().numpy()[:, :, 0]
    got = routed(values, snap._pointers(attn, unit)[0, :, 0].numpy(), attn.P)
    rate = float((got == routed(values, rule_keys(with_pads, {"x": values}, attn.P, T), attn.P)).mean())
    assert 0.3 <= rate < 0.95
    kept = snap.snap_heads(m, xt, yt, valid)
    s0 = next(s for s in kept if s.replica == 0)
    assert "argmin of x over the whole prefix" in s0.rule and "pads" not in s0.rule
    assert s0.loss_after < 1e-10 < s0.loss_before
