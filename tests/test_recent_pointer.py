"""Recency heads ("the latest j where pred(k_j)"): routing, the rule reader, the emitted program,
snapping, config and checkpoints (wtc.dt.attention.recency_params, wtc.extraction.routing_rules)."""
import json
import re

import numpy as np
import pytest
import torch

from wtc.dt import DTConfig, checkpoint
from wtc.dt.attention import RECENCY_SLOPE
from wtc.dt.config import ConfigError
from wtc.dt.model import DiscreteTransformer
from wtc.dt.refine import _inputs_of
from wtc.dt import snap
from wtc.extraction.program import Line, Program, build_source
from wtc.extraction.routing_rules import Rule, fit_head, latest_rules, routed, rule_keys

T = 8
BIG = 100.0


def hand_model(strict: bool, n_heads: int = 1, replicas: int = 1) -> DiscreteTransformer:
    """One layer whose last head is a recency head keyed on x (digits 0..3, unit x / 3) routing
    pos: it stops at the latest x != 0 (u . PLE = BIG above the first bin), pads above the zeros."""
    cfg = DTConfig(n_heads=n_heads, n_recent_heads=1, n_mlps=0, replicas=replicas, content_fraction=0.0)
    m = DiscreteTransformer(cfg, seq_len=T, n_inputs=1, n_outputs=1, replicas=replicas)
    attn, h = m.blocks[0].attn, n_heads - 1
    with torch.no_grad():
        m.var_lo[:, 0], m.var_hi[:, 0] = 0.0, 3.0
        attn.u[:, h] = 0.0
        attn.u[:, h, 0] = BIG
        attn.rel[:, h, 0] = -10 * BIG if strict else 0.0
        attn.abs[:, h, :attn.P] = BIG / 2
        attn.W.normal_()          # a recency head ignores its query term
        m.freeze()
        names = m.variable_names
        attn.select.frozen_index[:, attn.H + h] = names.index("x")           # key
        attn.select.frozen_index[:, 2 * attn.H + h] = names.index("pos")     # value
        m.W_out.zero_()
        m.W_out[:, names.index(attn.head_names[h]), 0] = 1.0
    return m


def brute_force(x: np.ndarray, strict: bool) -> np.ndarray:
    """pos / (T - 1) of the latest j (< t or <= t) with x_j != 0; 0 when there is none."""
    out = np.zeros(x.shape)
    for i in range(x.shape[0]):
        for t in range(x.shape[1]):
            for j in range(t - 1 if strict else t, -1, -1):
                if x[i, j] != 0:
                    out[i, t] = j / (T - 1)
                    break
    return out


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("backend", ["reference", "native"])
def test_recency_routing_equals_a_brute_force_loop(strict, backend, monkeypatch):
    monkeypatch.setenv("WTC_KERNELS", backend)
    x = np.random.default_rng(3).integers(0, 4, size=(200, T)).astype(float)
    x[:20, :4] = 0                                      # long runs of zeros: the pads are reached
    m = hand_model(strict)
    assert np.allclose(m.predict(x), brute_force(x, strict), atol=1e-6)


def test_recency_parameters_are_tied():
    m = hand_model(True, n_heads=2, replicas=2)
    attn = m.blocks[0].attn
    W, u, rel, abs_, content = attn.score_params()
    assert torch.equal(W[:, 1], torch.zeros_like(W[:, 1]))          # no query term
    d = torch.arange(1, rel.shape[-1], dtype=rel.dtype)
    assert torch.allclose(rel[:, 1, 1:], (-RECENCY_SLOPE * d).expand(2, -1))
    assert torch.equal(rel[:, 1, 0], attn.rel[:, 1, 0])                # rel[0] stays learned
    assert torch.equal(abs_[:, 1, attn.P:], torch.zeros_like(abs_[:, 1, attn.P:]))
    assert torch.equal(abs_[:, 1, :attn.P], attn.abs[:, 1, :attn.P])    # the pads' own
    assert torch.equal(rel[:, 0], attn.rel[:, 0]) and torch.equal(abs_[:, 0], attn.abs[:, 0])
    assert torch.equal(W[:, 0], torch.zeros_like(W[:, 0]))              # content_fraction 0: no content
    assert torch.equal(content, torch.ones(2))


def _pad(v, P):
    return np.concatenate([np.zeros((v.shape[0], P)), v], axis=1)


def carry_data(n=800, base=2, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, base, (n, T)), rng.integers(0, base, (n, T))
    return a, b, (a + b).astype(float)


def carry_keys(s, base, P):
    """The key of 'latest j < t with s_j != base - 1' by a plain loop (pads hold s = 0)."""
    sp = _pad(s, P)
    keys = np.zeros(s.shape, dtype=int)
    for i in range(s.shape[0]):
        for t in range(T):
            keys[i, t] = next((j for j in range(P + t - 1, -1, -1) if sp[i, j] != base - 1), 0)
    return keys


@pytest.mark.parametrize("base", [2, 3])
def test_rule_reader_recognises_a_carry_head_and_rejects_another(base):
    P = T - 1
    _, _, s = carry_data(base=base)
    values = {"s": _pad(s, P)}
    fit = fit_head("h", carry_keys(s, base, P), "s", values, P, T, window_vars=["s"])
    assert fit.rule is not None and fit.rule.kind == "recent", [c.describe() for c in fit.candidates]
    assert fit.rule.params["strict"]
    levels = np.arange(0, 2 * base - 1, dtype=float)
    from wtc.extraction.routing_rules import satisfies
    assert list(satisfies(fit.rule.params, levels)) == [v != base - 1 for v in levels]
    # a head that stops at the latest s == base - 1 half the time only: no rule
    noisy = carry_keys(s, base, P)
    flip = np.random.default_rng(1).random(noisy.shape) < 0.2
    noisy = np.where(flip, np.maximum(noisy - 1, 0), noisy)
    assert fit_head("h", noisy, "s", values, P, T, window_vars=["s"]).rule is None


def test_latest_rules_threshold_for_many_key_values():
    P = T - 1
    k = np.random.default_rng(2).uniform(0, 1, (300, T))
    values = {"k": _pad(k, P)}
    rule = Rule("recent", {"var": "k", "strict": False, "intervals": [[0.7, None]]})
    keys = rule_keys(rule, values, P, T)
    found = latest_rules(keys, values, ["k"], P, T)
    best = max(found, key=lambda r: (routed(values["k"], rule_keys(r, values, P, T), P)
                                     == routed(values["k"], keys, P)).mean())
    assert not best.params["strict"] and len(best.params["intervals"]) == 1
    lo, hi = best.params["intervals"][0]
    assert hi is None and 0.65 < lo < 0.75


@pytest.mark.parametrize("base", [2, 3, 5])
def test_emitted_carry_program_adds_on_fresh_data_and_at_twice_the_length(base):
    import sympy as sp
    rule = Rule("recent", {"var": "s", "strict": True, "intervals": [[None, base - 1.5], [base - 0.5, None]]})
    s, c, x0, x1 = sp.symbols("s latest_s x0 x1")
    lines = [Line("s", "expr", expr=x0 + x1), Line("latest_s", "route", "s", rule)]
    out = sp.Mod(s + sp.Piecewise((1, c >= base), (0, True)), base)
    source = build_source("add", 2, 1, ["x0", "x1"], lines, [out])
    namespace = {}
    exec(compile(source, "<program>", "exec"), namespace)        # a fresh module, from source
    program = namespace["program"]
    rng = np.random.default_rng(base)
    for length in (T, 2 * T):
        x = rng.integers(0, base, size=(50, length, 2))
        from wtc.tasks.mips import digit_addition
        want = digit_addition(x, base)
        got = np.array([program([tuple(map(float, row)) for row in seq]) for seq in x])
        assert np.array_equal(got, want), source


def _bits_domain(base: int):
    from wtc.extraction.domain import ChannelDomain, Domain
    digits = tuple(float(v) for v in range(base))
    return Domain((ChannelDomain("x0", digits, integer=True), ChannelDomain("x1", digits, integer=True)), (T, 2 * T),
                  any_length=True)


@pytest.mark.parametrize("base", [2, 3, 5])
def test_a_predicate_on_a_sub_mlp_of_few_valued_inputs_reads_in_those_inputs(base):
    """binary addition as read from a trained model: the carry is x1 at the latest position where
    a polynomial m of the digits is above a threshold; on the digits that is x0 == x1 (base 2) or
    x0 + x1 != base - 1, the program says so, drops m's line, and still adds at T and 2T."""
    import sympy as sp
    x0, x1, m, c = sp.symbols("x0 x1 m1 latest_m1")
    b = base
    # a key that is high exactly where the digit sum is not b - 1 (a bump read through a threshold)
    key = sp.Rational(523, 100) * (x0 + x1 - (b - 1)) ** 2 - sp.Rational(131, 100)
    rule = Rule("recent", {"var": "m1", "strict": True, "intervals": [[-1.0, None]]})
    lines = [Line("m1", "expr", expr=key), Line("s", "expr", expr=x0 + x1), Line("latest_m1", "route", "x1", rule)]
    s = sp.Symbol("s")
    # the carry is the latest non-propagating position's digit sum >= b (bits: x0 == x1 there, so
    # x1 itself is the carry)
    if b != 2:
        lines[2] = Line("latest_m1", "route", "s", rule)
        carry = sp.Piecewise((1, c >= b), (0, True))
    else:
        carry = c
    out = sp.Mod(s + carry, b)
    plain = build_source("add", 2, 1, ["x0", "x1"], lines, [out])
    source = build_source("add", 2, 1, ["x0", "x1"], lines, [out], domain=_bits_domain(b))
    want_text = "x0[t] == x1[t]" if b == 2 else f"x0[t] + x1[t] != {b - 1}"
    assert f"if {want_text}:" in source and not re.search(r"^\s*m1", source, re.M), source
    assert "-1 < m1[t]" in plain                                   # without a domain: the threshold as read
    from wtc.extraction.conditions import finite_condition
    assert finite_condition(key, rule.params, {"x0": (0.0, 1.0)}, str) is None     # x1's values unknown: as read
    from wtc.tasks.mips import digit_addition
    rng = np.random.default_rng(b)
    for text in (plain, source):
        namespace = {}
        exec(compile(text, "<program>", "exec"), namespace)        # a fresh module, from source
        for length in (T, 2 * T):
            x = rng.integers(0, b, size=(50, length, 2))
            got = np.array([namespace["program"]([tuple(map(float, row)) for row in seq]) for seq in x])
            assert np.array_equal(got, digit_addition(x, b)), text


def test_inclusive_program_is_the_last_nonzero():
    rule = Rule("recent", {"var": "x", "strict": False, "intervals": [[None, -0.5], [0.5, None]]})
    source = build_source("last_nonzero", 1, 1, ["x"], [Line("latest_x", "route", "x", rule)],
                          [__import__("sympy").Symbol("latest_x")])
    namespace = {}
    exec(compile(source, "<program>", "exec"), namespace)
    x = np.random.default_rng(5).integers(0, 4, size=(100, 2 * T)).astype(float)
    want = np.zeros_like(x)
    for t in range(x.shape[1]):
        want[:, t] = np.where(x[:, t] != 0, x[:, t], want[:, t - 1] if t else 0.0)
    got = np.array([namespace["program"](list(seq)) for seq in x])
    assert np.array_equal(got, want)


def test_snap_realises_a_latest_where_rule_exactly():
    x = np.random.default_rng(0).integers(0, 4, size=(128, T, 1)).astype(float)
    m = hand_model(True, n_heads=2, replicas=2)
    m.fit_normalization(x, x)
    attn = m.blocks[0].attn
    xt = m.normalize_inputs(torch.tensor(x, dtype=torch.float32))
    stream, unit = _inputs_of(m, attn, xt)
    values = {"k": unit[1].double().numpy()[:, :, 0]}
    pos = stream[1].double().numpy()[:, :, m.variable_names.index("pos")]
    for strict in (True, False):
        for intervals in ([[None, 0.2], [0.5, None]], [[0.8, None]], [[0.2, 0.5]]):
            rule = Rule("recent", {"var": "k", "strict": strict, "intervals": intervals})
            snap.realise(attn, 1, 1, rule, 0, unit)
            got = routed(pos, snap._pointers(attn, unit)[1, :, 1].numpy(), attn.P)
            want = routed(pos, rule_keys(rule, values, attn.P, T), attn.P)
            assert np.array_equal(got, want), rule.describe()


def test_config_and_checkpoint_round_trip(tmp_path):
    cfg = DTConfig(n_layers=2, n_heads=(0, 2), n_recent_heads=(0, 1), n_mlps=(2, 1), replicas=2)
    assert DTConfig.from_dict(json.loads(cfg.to_json())) == cfg
    assert "n_recent_heads" not in DTConfig().to_dict()            # records without them read as before
    assert DTConfig.from_dict(DTConfig().to_dict()) == DTConfig()
    with pytest.raises(ConfigError, match="n_recent_heads"):
        DTConfig(n_heads=1, n_recent_heads=2)
    with pytest.raises(ConfigError, match="n_recent_heads"):
        DTConfig(n_layers=2, n_recent_heads=(1,))
    for attempt in range(5):                         # every rung of the ladder keeps the recency heads
        _, rung = cfg.rung(attempt)
        assert rung.n_recent_heads[-1] == 1 and all(r <= h for r, h in zip(rung.n_recent_heads, rung.n_heads))
    m = hand_model(True, n_heads=2, replicas=1)
    x = np.random.default_rng(1).integers(0, 4, size=(30, T)).astype(float)
    checkpoint.save(m, tmp_path / "m")
    back = checkpoint.load(tmp_path / "m")
    assert back.config.n_recent_heads == (1,)
    assert np.array_equal(back.predict(x), m.predict(x))


def test_a_model_without_recency_heads_is_unchanged():
    torch.manual_seed(0)
    a = DiscreteTransformer(DTConfig(replicas=2), seq_len=T)
    attn = a.blocks[0].attn
    assert attn.score_params() == (attn.W, attn.u, attn.rel, attn.abs, attn.content)
    assert "blocks.0.attn.recent" not in a.state_dict()     # old checkpoints load: nothing new is saved


def last_nonzero(x):
    out = np.zeros_like(x)
    current = np.zeros(len(x), dtype=x.dtype)
    for t in range(x.shape[1]):
        current = np.where(x[:, t] != 0, x[:, t], current)
        out[:, t] = current
    return out


def test_discover_starts_with_recency_heads_on_a_tail_of_rare_reads():
    import wtc
    from wtc.discovery import sized_for
    from wtc.tasks.probe import dependence

    task = wtc.Task("last_nonzero", sample=lambda rng, n: rng.integers(0, 4, size=(n, 10)), target=last_nonzero,
                    seq_len=10)
    grown, why = sized_for(DTConfig(), dependence(task))
    assert grown.n_recent_heads == (0, 2) and grown.n_layers == 2 and "recency heads" in why, why
    kept, _ = sized_for(DTConfig(n_heads=4), dependence(task))        # a layout set by hand is kept
    assert kept.n_recent_heads == (0,) and kept.n_layers == 1
    for name in ("sum_last5", "max_last3", "prev4", "running_max"):   # bands and prefixes: no tail
        assert not any(sized_for(DTConfig(), dependence(wtc.tasks.get(name)))[0].n_recent_heads), name


def _bit_sum(x):
    """Binary addition of two bit channels, least significant first (the last carry dropped)."""
    out, carry = np.zeros(x.shape[:2], dtype=np.int64), np.zeros(x.shape[0], dtype=np.int64)
    for t in range(x.shape[1]):
        s = x[:, t, 0] + x[:, t, 1] + carry
        out[:, t], carry = s % 2, s // 2
    return out


def test_a_carry_over_bits_is_told_by_rates_that_halve_with_each_step_back():
    """With two symbols a carry chain reaches every offset in some probe sequence (no band and
    tail), but the share of swaps that move y_t halves with each step back, the same at every t."""
    import wtc
    from wtc.discovery import sized_for
    from wtc.dt.recency import decaying_rates, tail_offsets
    from wtc.tasks.probe import dependence

    bits = wtc.Task("bit_sum", sample=lambda rng, n: rng.integers(0, 2, size=(n, 10, 2)), target=_bit_sum,
                    seq_len=10, n_inputs=2)
    dep = dependence(bits)
    assert not tail_offsets(dep)
    decay = dict(decaying_rates(dep))
    assert set(decay) == {0, 1}
    for rates in decay.values():                                  # 1/2, 1/4, 1/8 within the probe's noise
        assert all(abs(r - 0.5 ** d) < 0.06 for d, r in zip((1, 2, 3), rates)), rates
    grown, why = sized_for(DTConfig(), dep)
    assert grown.n_recent_heads == (0, 2) and "geometrically" in why, why
    others = {"prefix count mod 3": (lambda rng, n: rng.integers(0, 3, size=(n, 10)), lambda x: np.cumsum(x, 1) % 3),
              "prefix max": (lambda rng, n: rng.integers(0, 10, size=(n, 10)), lambda x: np.maximum.accumulate(x, 1)),
              "majority": (lambda rng, n: rng.integers(0, 2, size=(n, 10)),
                           lambda x: (2 * np.cumsum(x, 1) > np.arange(1, 11)).astype(np.int64)),
              # the last 3 bits alternate: rates 1/2, 1/4, then exactly 0 (a window, cut off)
              "alternating": (lambda rng, n: rng.integers(0, 2, size=(n, 10)),
                              lambda x: np.stack([[int(t >= 2 and r[t] != r[t - 1] != r[t - 2]) for t in range(10)]
                                                  for r in x]))}
    for name, (sample, target) in others.items():
        dep = dependence(wtc.Task(name.replace(" ", "_"), sample=sample, target=target, seq_len=10))
        assert not decaying_rates(dep), name


def test_a_sub_mlp_on_a_small_grid_is_read_as_its_interpolating_polynomial():
    """A digit-sum key on digits 0..2 is a 3 x 3 table of reals (wtc.extraction.grid)."""
    import sympy as sp
    from wtc.extraction.grid import grid_polynomial

    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, (500, 2)).astype(float)
    table = rng.normal(size=(3, 3))
    y = table[X[:, 0].astype(int), X[:, 1].astype(int)]
    tol = 1e-3 * float(np.sqrt(np.mean(y ** 2)))
    expr = grid_polynomial(X, y, ("a", "b"), tol)
    f = sp.lambdify(sp.symbols("a b"), expr)
    assert np.sqrt(np.mean((f(X[:, 0], X[:, 1]) - y) ** 2)) <= tol
    assert grid_polynomial(rng.uniform(size=(50, 2)), rng.normal(size=50), ("a", "b"), 0.01) is None   # no grid


@pytest.mark.parametrize("strict", [True, False])
def test_rule_reader_recognises_a_hand_set_recency_head_and_rejects_a_scrambled_one(strict):
    from wtc.extraction.readout import pad, read

    x = np.random.default_rng(4).integers(0, 4, size=(800, T)).astype(float)
    m = hand_model(strict)
    ro = read(m, x[..., None])
    P = ro.P
    values = {"x": pad(x, P), "t": pad(np.tile(np.arange(T, dtype=float), (len(x), 1)), P)}
    fit = fit_head("L0.h0", ro.pointers["L0.h0"], "t", values, P, T, window_vars=["x"])
    assert fit.rule is not None and fit.rule.kind == "recent" and fit.rule.params["strict"] == strict
    assert fit.rule.params["intervals"] == [[0.5, None]]            # x != 0 for digits 0..3
    with torch.no_grad():           # graded scores, x = 0, 1, 2, 3 -> 0, 20, 5, 12: an order, not a predicate
        attn = m.blocks[0].attn
        attn.u[0, 0] = 0.0
        attn.u[0, 0, 0], attn.u[0, 0, 6], attn.u[0, 0, 11] = 20.0, -15.0, 7.0
        attn.abs[0, 0] = 0.0
    scrambled = read(m, x[..., None]).pointers["L0.h0"]
    assert fit_head("L0.h0", scrambled, "t", values, P, T, window_vars=["x"]).rule is None
