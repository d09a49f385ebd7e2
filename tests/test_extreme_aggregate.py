"""Prefix-extreme aggregate heads (DTConfig.agg_ops "max" / "min"): the op against a float64
brute force (values and gradients), the heads inside a model, their program units, and a planted
head read back as a `max(x[:t + 1])` line whose source, exec'd in a fresh namespace, holds at four
times the length it was read at."""
import json

import numpy as np
import pytest
import torch

from wtc.dt import DTConfig
from wtc.dt import checkpoint
from wtc.dt.attention import prefix_extremes
from wtc.dt.config import ConfigError
from wtc.extraction import extract, verify
from wtc.tasks import Task

from planting import aggregate_outputs, planted_aggregates, run_source  # noqa: E402  (tests/ is on sys.path)


def brute(val: torch.Tensor, op: str) -> torch.Tensor:
    """The definition, one prefix at a time: out_t = max (min) of val_0 .. val_t."""
    pick = torch.amax if op == "max" else torch.amin
    return torch.stack([pick(val[..., :t + 1], dim=-1) for t in range(val.shape[-1])], -1)


def test_the_op_is_the_prefix_extreme_and_its_gradient_the_brute_forces(rng):
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    val = torch.randn(2, 3, 4, 9, generator=gen, dtype=torch.float64, requires_grad=True)   # (R, B, A, T)
    base = torch.randn(2, 3, 4, 9, generator=gen, dtype=torch.float64, requires_grad=True)  # what the other heads wrote
    heads = [(0, "max"), (2, "min"), (3, "max")]
    out = prefix_extremes(val, base, heads)
    weights = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grad_val, grad_base = torch.autograd.grad((out * weights).sum(), (val, base))
    ref = torch.stack([brute(val[:, :, 0], "max"), base[:, :, 1], brute(val[:, :, 2], "min"),
                       brute(val[:, :, 3], "max")], 2)
    ref_val, ref_base = torch.autograd.grad((ref * weights).sum(), (val, base))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(grad_val, ref_val, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_base, ref_base, rtol=0, atol=0)
    assert torch.all(grad_val[:, :, 1] == 0) and torch.all(grad_base[:, :, [0, 2, 3]] == 0)


def test_heads_write_prefix_extremes_in_their_values_units():
    model, z, v = aggregate_outputs(("max", "mean", "min"), replicas=2)   # z (R, B, 3, T)
    v = v.expand(2, -1, -1)                                                  # (R, B, T)
    torch.testing.assert_close(z[:, :, 0], brute(v, "max"), rtol=0, atol=0)
    torch.testing.assert_close(z[:, :, 2], brute(v, "min"), rtol=0, atol=0)
    torch.testing.assert_close(z[:, :, 1], v.cumsum(-1) / torch.arange(1, 8), rtol=1e-6, atol=1e-6)
    growth = model.blocks[0].attn.unit_growth()                              # (T, A): program unit over the value's
    assert torch.all(growth[:, [0, 2]] == 1) and torch.equal(growth[:, 1], torch.arange(1.0, 8.0))


@pytest.mark.parametrize("ops", [("max", "maximum"), ("most",)])
def test_unknown_ops_are_refused_in_one_line(ops):
    with pytest.raises(ConfigError, match="agg_ops must be"):
        DTConfig(agg_ops=ops)


@pytest.mark.parametrize("op", ["max", "min"])
def test_a_planted_head_reads_as_an_extreme_line_that_holds_longer(rng, op, tmp_path):
    extreme = np.maximum if op == "max" else np.minimum
    task = Task(f"running_{op}", lambda r, n: r.integers(-4, 5, (n, 8)),
                lambda x: extreme.accumulate(x, axis=1), seq_len=8, any_length=True)
    model, _ = planted_aggregates(task, DTConfig(n_heads=0, n_agg_heads=1, n_mlps=0, agg_ops=(op,), replicas=1))
    program = extract(model, task)
    assert program.ok, program.failures
    assert [(ln.kind, ln.source) for ln in program.lines] == [(op, "x")]
    assert f"= {op}(x[:t + 1])" in program.source
    v = verify(program, task, n=500, seed=int(rng.integers(2**31)))
    assert v.solved and v.holds_longer, v
    from wtc.discover_job import program_from_dict, program_to_dict
    back = program_from_dict(json.loads(json.dumps(program_to_dict(program))))   # as rungs hand it over
    assert back.source == program.source and back.lines == program.lines
    longer = rng.integers(-4, 5, (40, 32)).astype(float)                  # 4T: the line, not the model
    np.testing.assert_array_equal(run_source(program.source, longer), extreme.accumulate(longer, axis=1))
    checkpoint.save(model, tmp_path / "m")                                 # a checkpoint keeps the op
    fresh = rng.integers(-4, 5, (20, 8, 1)).astype(float)
    np.testing.assert_array_equal(checkpoint.load(tmp_path / "m").predict(fresh), model.predict(fresh))


def _table(rng):
    """x, p in 0..3 on (n, T) and a smooth-looking table m(x, p) whose sign is [x < p]."""
    x = rng.integers(0, 4, (300, 6)).astype(float)
    p = rng.integers(0, 4, (300, 6)).astype(float)
    m = np.where(x < p, 0.4 + 0.1 * p, -0.3 - 0.2 * x * (p + 1))
    return x, p, m


def _values(x, p, m, op):
    return {"x": x, "p": p, "m0": m, "e": (np.maximum if op == "max" else np.minimum).accumulate(m, axis=1)}


def _lines(op, expr):
    from wtc.extraction.program import Line
    return [Line("m0", "expr", expr=expr), Line("e", op, "m0")]


@pytest.mark.parametrize("op", ["max", "min"])
def test_a_sub_mlp_only_cut_under_an_extreme_is_read_as_its_indicator(rng, op):
    import sympy as sp
    from wtc.extraction.indicators import indicators_under_extremes
    from wtc.sr.expr import Ge
    x, p, m = _table(rng)
    e = sp.Symbol("e")
    poly = sp.Symbol("x") ** 3 - sp.Symbol("p") / 7     # what a table's polynomial looks like: its values are m's
    lines, outputs, notes = indicators_under_extremes(_lines(op, poly), [1 - Ge(e, 0)], _values(x, p, m, op))
    b = sp.lambdify([sp.Symbol("p"), sp.Symbol("x")], lines[0].expr)(p, x)
    np.testing.assert_array_equal(b, (m >= 0).astype(float))           # the indicator, exactly
    assert outputs == [1 - e] and len(notes) == 1 and lines[1] == _lines(op, poly)[1]
    values = _values(x, p, m, op)
    want = 1 - (values["e"] >= 0)                                       # the program's decisions, unchanged
    got = 1 - (np.maximum if op == "max" else np.minimum).accumulate(b, axis=1)
    np.testing.assert_array_equal(got, want)
    cond = [sp.Piecewise((2, e > 0), (5, True))]                        # a condition: `> 0` reads [m > 0]
    lines, outputs, _ = indicators_under_extremes(_lines(op, poly), cond, _values(x, p, m, op))
    assert outputs == [sp.Piecewise((2, sp.Eq(e, 1)), (5, True))]


def test_an_extreme_whose_value_is_used_or_whose_sub_mlp_is_read_elsewhere_is_left_alone(rng):
    import sympy as sp
    from wtc.extraction.indicators import indicators_under_extremes
    from wtc.sr.expr import Ge
    x, p, m = _table(rng)
    e, poly = sp.Symbol("e"), sp.Symbol("x") ** 3 - sp.Symbol("p") / 7
    for outputs in ([e + Ge(e, 0)], [Ge(e, 0) + sp.Symbol("m0")], [Ge(e, 0) + Ge(e, 1)]):
        lines, got, notes = indicators_under_extremes(_lines("max", poly), outputs, _values(x, p, m, "max"))
        assert got == outputs and lines == _lines("max", poly) and not notes
