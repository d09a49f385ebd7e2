"""Periodic aggregate heads (DTConfig.agg_ops "per2" .. "per8", wtc.dt.periodic): a prefix sum
weighted by a learned periodic function of the distance, checked against a brute-force float64
double loop (values and gradients), read back as a plain-Python line whose source, exec'd in a fresh
namespace, agrees with the model on fresh and longer sequences; config errors; checkpoints."""
import ast
import json

import numpy as np
import pytest
import torch

from wtc.dt import DTConfig, DiscreteTransformer
from wtc.dt import checkpoint
from wtc.dt.attempt import Attempt
from wtc.dt.config import ConfigError
from wtc.dt.periodic import initial_patterns, period_of, periodic_sum
from wtc.dt.periodic_snap import snap_coefficients
from wtc.extraction import extract, verify
from wtc.extraction.weighted import periodic_source, simple_number, weighted_prefix
from wtc.tasks import Task

from planting import aggregate_outputs, planted_aggregates, run_source  # noqa: E402  (tests/ is on sys.path)


def brute(val: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """The definition, one term at a time: out_t = sum_{j <= t} coef[(t - j) mod p] val_j."""
    p, T = coef.shape[-1], val.shape[-1]
    cols = []
    for t in range(T):
        terms = [coef[..., (t - j) % p] * val[..., j] for j in range(t + 1)]
        cols.append(torch.stack(terms, -1).sum(-1))
    return torch.stack(cols, -1)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
def test_the_op_is_the_weighted_prefix_sum(rng, p):
    seed = int(rng.integers(2**31))
    g = torch.Generator().manual_seed(seed)
    val = torch.randn(3, 2, 4, 11, dtype=torch.float64, generator=g)
    coef = torch.randn(3, 1, 4, p, dtype=torch.float64, generator=g)
    torch.testing.assert_close(periodic_sum(val, coef), brute(val, coef), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weighted_prefix(val[0, 0].numpy(), coef[0, 0, 0].tolist()),
                               brute(val[0, 0], coef[0, 0, :1].expand(4, -1)).numpy(), rtol=1e-12, atol=1e-12)


def test_the_ops_gradients_are_the_brute_forces(rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    val = torch.randn(2, 3, 9, dtype=torch.float64, generator=g, requires_grad=True)
    coef = torch.randn(2, 1, 4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(periodic_sum, (val, coef))
    w = torch.randn(2, 3, 9, dtype=torch.float64, generator=g)
    fast = torch.autograd.grad((periodic_sum(val, coef) * w).sum(), (val, coef))
    slow = torch.autograd.grad((brute(val, coef) * w).sum(), (val, coef))
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ops", [("per1",), ("per9",), ("periodic",), ("per",), ("mean", "per02x")])
def test_bad_periodic_ops_are_refused_in_one_line(ops):
    with pytest.raises(ConfigError, match="agg_ops") as err:
        DTConfig(n_agg_heads=2, agg_ops=ops)
    assert "\n" not in str(err.value)


def test_ops_names_and_initial_patterns():
    assert [period_of(op) for op in ("per2", "per8", "sum", "mean", "per9")] == [2, 8, None, None, None]
    for p in range(2, 9):
        patterns = initial_patterns(p)
        assert len(set(patterns)) == len(patterns) >= 7
        assert all(len(c) == p and len(set(c)) > 1 for c in patterns)      # never a plain sum
    assert initial_patterns(2)[0] == (1, -1)                              # 2^k mod 3, centred
    assert (1, 2, -1, -2) in initial_patterns(4)[:2]                      # 2^k mod 5, centred


def test_heads_write_their_weighted_sums_over_T_and_differ_across_replicas():
    model, z, v = aggregate_outputs(("per2", "mean", "per3"), replicas=4)
    z, v = z.double(), v.double()                                            # (R, B, 3, T), (B, T)
    coef = model.blocks[0].attn.periodic.coef.detach().double()             # (R, 2, 3)
    for i, (a, p) in enumerate([(0, 2), (2, 3)]):
        want = brute(v.expand(4, -1, -1), coef[:, None, i, :p]) / 7
        torch.testing.assert_close(z[:, :, a], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z[:, :, 1], (v.cumsum(-1) / torch.arange(1, 8)).expand(4, -1, -1), rtol=1e-6, atol=1e-6)
    assert len({tuple(c) for c in coef[:, 0, :2].tolist()}) == 4


def _alternating(c):
    """A task linear in a periodic prefix sum of small integers."""
    def target(x):
        return weighted_prefix(x.astype(float), c)
    return Task(f"weighted{c}", lambda rng, n: rng.integers(-3, 4, (n, 8)), target, seq_len=8, output="real")


def _planted(task, coefficients, noise=0.0):
    cfg = DTConfig(n_heads=0, n_agg_heads=1, n_mlps=0, agg_ops=(f"per{len(coefficients)}",), replicas=1)
    return planted_aggregates(task, cfg, lambda model: model.blocks[0].attn.periodic.set_coef(
        torch.tensor(coefficients)[None, None] + noise))


@pytest.mark.parametrize("c", [(1.0, -1.0), (2.0, 0.5, -1.0), (1.0, 2.0, -1.0, -2.0)])
def test_a_planted_head_reads_as_a_periodic_line_that_holds_longer(rng, c):
    task = _alternating(c)
    model, _ = _planted(task, c)
    program = extract(model, task)
    assert program.ok, program.failures
    assert [ln.kind for ln in program.lines] == ["periodic"]
    assert program.lines[0].rule.params["coefficients"] == [simple_number(v) for v in c]
    line = periodic_source(program.lines[0].name, "x", program.lines[0].rule.params["coefficients"])
    assert ast.unparse(ast.parse(line)) in program.source
    assert verify(program, task, n=500, seed=int(rng.integers(2**31))).solved
    from wtc.discover_job import program_from_dict, program_to_dict
    back = program_from_dict(json.loads(json.dumps(program_to_dict(program))))   # as rungs hand it over
    assert back.source == program.source and back.lines[0].rule == program.lines[0].rule
    fresh = rng.integers(-3, 4, (40, 8)).astype(float)
    np.testing.assert_allclose(run_source(program.source, fresh), model.predict(fresh[..., None]).reshape(40, 8),
                               atol=1e-3)
    longer = rng.integers(-3, 4, (40, 32)).astype(float)                  # 4T: the line, not the model
    np.testing.assert_allclose(run_source(program.source, longer), weighted_prefix(longer, c), atol=1e-9)


def test_near_integral_coefficients_are_snapped_when_the_loss_allows():
    task = _alternating((1.0, -1.0))
    model, run = _planted(task, (1.0, -1.0), noise=0.07)
    x, y, valid, _ = run.fit_data
    snaps = snap_coefficients(model, x[:256], y[:256], valid[:256])
    assert [s["after"] for s in snaps] == [[1, -1]]
    assert model.blocks[0].attn.periodic.coefficients(0, 0) == [1.0, -1.0]
    assert snap_coefficients(model, x[:256], y[:256], valid[:256]) == []         # integral already


def test_the_snap_and_the_pointer_refinement_start_nothing_after_the_deadline(monkeypatch):
    """discover's finish passes its deadline: past it the coefficients stay as trained and no
    pointer head is refitted (the budget is kept), before it the snap runs as above."""
    import time
    from wtc.dt.refine import refine_pointers

    task = _alternating((1.0, -1.0))
    model, run = _planted(task, (1.0, -1.0), noise=0.07)
    x, y, valid, _ = run.fit_data
    coef = model.blocks[0].attn.periodic.coef.detach().clone()
    assert snap_coefficients(model, x[:256], y[:256], valid[:256], until=time.time() - 1) == []
    assert torch.equal(model.blocks[0].attn.periodic.coef.detach(), coef)
    snaps = snap_coefficients(model, x[:256], y[:256], valid[:256], until=time.time() + 600)
    assert [s["after"] for s in snaps] == [[1, -1]]
    from wtc.dt import refine
    pointers = Attempt(task, DTConfig(n_heads=2, n_mlps=1, replicas=2), seed=0, attempt=0).model
    pointers.freeze()
    fitted = []
    monkeypatch.setattr(refine, "refine_head", lambda m, attn, h, *a, **k: fitted.append(h) or torch.zeros(2, dtype=torch.bool))
    assert refine_pointers(pointers, x[:64], y[:64], valid[:64], until=time.time() - 1) == 0 and fitted == []
    refine_pointers(pointers, x[:64], y[:64], valid[:64], until=time.time() + 600)
    assert fitted == [0, 1]


def test_checkpoint_round_trip_keeps_the_coefficients(tmp_path):
    cfg = DTConfig(n_heads=1, n_agg_heads=2, n_mlps=1, agg_ops=("per3", "sum"), replicas=2)
    model = DiscreteTransformer(cfg, seq_len=6)
    with torch.no_grad():
        model.blocks[0].attn.periodic.set_coef(torch.randn(2, 1, 3))
    checkpoint.save(model, tmp_path / "m")
    back = checkpoint.load(tmp_path / "m")
    torch.testing.assert_close(back.blocks[0].attn.periodic.coef, model.blocks[0].attn.periodic.coef)
    x = torch.randn(3, 6, 1)
    model.eval()
    torch.testing.assert_close(back(x)[0], model(x)[0])
    one = model.replica(1)
    torch.testing.assert_close(one.blocks[0].attn.periodic.coef[0], model.blocks[0].attn.periodic.coef[1])


def _div(d):
    def target(x):
        out, r = np.zeros_like(x), np.zeros(len(x), dtype=x.dtype)
        for t in range(x.shape[1]):
            v = 2 * r + x[:, t]
            out[:, t], r = v // d, v % d
        return out
    return Task(f"div{d}", lambda rng, n: rng.integers(0, 2, (n, 10)), target, seq_len=10)


@pytest.mark.parametrize("d, p", [(3, 2), (5, 4), (7, 3)])
def test_the_probe_finds_the_period_of_long_division_and_discover_sizes_for_it(d, p):
    from wtc.discovery import sized_for
    from wtc.tasks.probe import dependence

    dep = dependence(_div(d))
    assert dep.prefix == [True] and dep.periods == [p], dep.describe()
    config, why = sized_for(DTConfig(), dep)
    assert config.agg_ops == (f"per{p}",) and config.n_agg_heads == (2,) and f"per{p}" in why
    assert d in config.mlp_periods
    kept, _ = sized_for(DTConfig(agg_ops=("sum",), mlp_periods=(2,)), dep)      # what a user set stays
    assert kept.agg_ops == ("sum",) and kept.mlp_periods == (2,)


def test_plain_prefix_reads_have_no_period():
    from wtc.tasks.probe import dependence

    counter = Task("cm3", lambda rng, n: rng.integers(0, 3, (n, 10)), lambda x: np.cumsum(x, 1) % 3, seq_len=10)
    running_max = Task("rmax", lambda rng, n: rng.integers(0, 5, (n, 10)), lambda x: np.maximum.accumulate(x, 1),
                       seq_len=10)
    assert dependence(counter).periods == [0] and dependence(running_max).periods == [0]


def _spring(x):
    """A unit mass on a unit spring from rest, forces x_t (a loop over t, as a user writes it)."""
    out = np.zeros(x.shape, dtype=np.int64)
    p = v = np.zeros(len(x), dtype=np.int64)
    for t in range(x.shape[1]):
        v = v + x[:, t] - p
        p = p + v
        out[:, t] = p
    return out


def test_a_linear_response_of_period_six_is_found_with_many_values_per_position():
    """A spring's response to x_(t-d) is 1, 1, 0, -1, -1, 0, ..: zero at every third offset, so the
    offsets read are not a prefix, and with 21 force values no two samples share their phase sums;
    the exact affine test finds period 6 and discover starts with per6 heads, no residue units.
    A double prefix sum (response d + 1, not periodic) has no period."""
    from wtc.discovery import sized_for
    from wtc.tasks.probe import dependence

    forces = lambda rng, n: rng.integers(-10, 11, (n, 10))          # noqa: E731
    dep = dependence(Task("spring", forces, _spring, seq_len=10))
    assert dep.prefix == [True] and dep.periods == [6] and dep.affine == [True], dep.describe()
    config, why = sized_for(DTConfig(), dep)
    assert config.agg_ops == ("per6",) and config.mlp_periods == () and "per6" in why, why
    assert [1, 1, 0, -1, -1, 0] == [int(v) for v in _spring(np.eye(6, dtype=np.int64)[:1])[0]]
    double = Task("freebody", forces, lambda x: np.cumsum(np.cumsum(x, 1), 1), seq_len=10)
    assert dependence(double).periods == [0]
