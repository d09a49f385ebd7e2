"""Sum aggregate heads (DTConfig.agg_ops): the prefix sum as a module (written as sum / T), so a
sum of sums is linear in a two-layer stream; checked against float64 cumsums, read back as
`sum(...)` lines, and the emitted source exec'd on fresh and longer sequences."""
import numpy as np
import pytest
import sympy as sp
import torch

import wtc
from wtc.dt import DTConfig, DiscreteTransformer
from wtc.dt.config import ConfigError
from wtc.extraction import extract, verify

from planting import aggregate_outputs, planted_aggregates, run_source  # noqa: E402  (tests/ is on sys.path)


@pytest.mark.parametrize("ops", [(), ("median",), "sum", ("mean", 3)])
def test_bad_agg_ops_are_refused_by_name(ops):
    with pytest.raises(ConfigError, match="agg_ops"):
        DTConfig(n_agg_heads=2, agg_ops=ops)


def test_ops_cycle_over_heads_and_survive_a_round_trip():
    cfg = DTConfig(n_heads=1, n_agg_heads=3, agg_ops=("mean", "sum"))
    model = DiscreteTransformer(cfg, seq_len=5)
    assert model.blocks[0].attn.agg_ops == ["mean", "sum", "mean"]
    assert DTConfig.from_dict(cfg.to_dict()) == cfg


def test_aggregates_never_read_pos_and_chain_in_every_other_replica():
    cfg = DTConfig(n_layers=2, n_heads=1, n_agg_heads=2, n_mlps=1, agg_ops=("mean", "sum"), replicas=4)
    model = DiscreteTransformer(cfg, seq_len=5)
    for layer, block in enumerate(model.blocks):
        sel = block.attn.select
        for a in range(2):
            slot = sel.slot_names.index(f"L{layer}.a{a}.v")
            assert not sel.mask[slot, sel.variable_names.index("pos")]
            if layer:
                logits = sel.masked_logits()[:, slot]                            # (R, V)
                prev = sel.variable_names.index(f"L0.a{a}")
                assert (logits[::2].argmax(-1) == prev).all()
                assert (logits[1::2, prev] < 1).all()


def _rung(config, label):
    return next(rung for i in range(10) for lab, rung in [config.rung(i)] if lab == label)


def test_two_layer_rungs_add_sums_and_keep_the_users_ops():
    rung = _rung(DTConfig(n_agg_heads=2), "two layers: chained sub-MLPs")
    assert rung.n_layers == 2 and rung.agg_ops == ("mean", "sum")
    assert _rung(DTConfig(n_agg_heads=2, agg_ops=("sum",)), "two layers: heads in both").agg_ops == ("sum", "mean")
    assert _rung(DTConfig(n_agg_heads=2), "+ aggregate heads").agg_ops == ("mean",)


def test_sum_and_mean_heads_match_float64_cumsums():
    model, z, v = aggregate_outputs(("mean", "sum"), replicas=3)
    z, v = z.double(), v.double()                                            # (R, B, 2, T), (B, T)
    csum = v.cumsum(-1)
    torch.testing.assert_close(z[:, :, 1], csum.expand(3, -1, -1) / 7, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(z[:, :, 0], (csum / torch.arange(1, 8)).expand(3, -1, -1), rtol=1e-6, atol=1e-6)


def test_a_sum_heads_periodic_unit_is_its_sources():
    """A counter mod k reads the sum in input units: a mean head's unit grows with t, a sum head's
    is T times its source's (it writes sum / T)."""
    cfg = DTConfig(n_heads=0, n_agg_heads=2, n_mlps=1, agg_ops=("mean", "sum"), replicas=1, mlp_periods=(3,),
                   read={"L0.a*.v": ["x"]})
    model = DiscreteTransformer(cfg, seq_len=4)
    model.freeze()
    seen = {}
    real = model.blocks[0].mlp.forward

    def spy(stream, sampling, units):
        seen["units"] = units
        return real(stream, sampling, units)

    model.blocks[0].mlp.forward = spy
    model(torch.randn(2, 4, 1))
    units = seen["units"][0]                                     # (T, V): x, pos, L0.a0, L0.a1
    x_unit = model.x_scale[0]
    torch.testing.assert_close(units[:, 2], x_unit * torch.arange(1.0, 5.0))
    torch.testing.assert_close(units[:, 3], 4 * x_unit.expand(4))


def _planted_sums(task, layers: int):
    """A frozen model of `layers` layers, one sum head each: layer 0 sums x, layer l sums layer
    l - 1's sum; the head refit to the task."""
    cfg = DTConfig(n_layers=layers, n_heads=0, n_agg_heads=1, n_mlps=0, agg_ops=("sum",), replicas=1)
    return planted_aggregates(task, cfg)[0]


def test_a_prefix_sum_reads_as_a_sum_line():
    task = wtc.tasks.get("running_sum")
    program = extract(_planted_sums(task, 1), task)
    assert program.ok, program.failures
    assert [ln.kind for ln in program.lines] == ["sum"] and "sum(x[:t + 1])" in program.source
    assert sp.simplify(program.outputs[0] - sp.Symbol("sum_x")) == 0, program.outputs
    assert verify(program, task, n=2000, seed=4).solved


def test_a_double_prefix_sum_is_two_sum_lines_and_holds_on_longer_sequences(rng):
    task = wtc.tasks.get("double_prefix_sum")
    program = extract(_planted_sums(task, 2), task)
    assert program.ok, program.failures
    assert [ln.kind for ln in program.lines] == ["sum", "sum"]
    assert verify(program, task, n=2000, seed=5).solved
    x = rng.integers(0, 3, (50, 25, 1)).astype(float)          # 25 positions; the model saw 10
    want = np.cumsum(np.cumsum(x[..., 0], axis=1), axis=1)
    np.testing.assert_array_equal(np.round(run_source(program.source, x[..., 0])), want)
