"""Periodic units of the sub-MLPs (DTConfig.mlp_periods): the features, their exactness on integer
tables, every backend against the reference, and a planted model read back as `%`."""
import copy
import fnmatch
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import wtc
from wtc.dt import DTConfig, DiscreteTransformer
from wtc.dt.attempt import Attempt
from wtc.dt.config import ConfigError
from wtc.dt.finish import polish, refit_head
from wtc.dt.selection import EVAL, Sampling
from wtc.dt.submlp import frequencies, periodic_features
from wtc.extraction import extract, verify

PERIODS = (2, 3, 4, 5, 6)


def test_frequencies_are_the_reduced_fractions_up_to_one_half():
    freqs, n_sine = frequencies(PERIODS)
    assert np.allclose(freqs.numpy(), [1 / 6, 1 / 5, 1 / 4, 1 / 3, 2 / 5, 1 / 2])
    assert n_sine == 5                                   # sin(pi n) = 0 on integers: no sine for 1/2
    assert periodic_features(torch.zeros(3, 4), freqs).shape == (3, 11, 4)


@pytest.mark.parametrize("table,domain", [
    (lambda n: n % 3, 30), (lambda n: 1 - n % 2, 100), (lambda n: n // 3, 30), (lambda n: n % 5, 50),
    (lambda n: np.isin(n, (2, 3, 5, 7)).astype(float), 10), (lambda n: (n % 4 == 1).astype(float), 40),
])
def test_functions_of_small_residues_are_linear_in_the_features(table, domain):
    """n % P, parity, n // 3 = (n - n % 3) / 3 and any table over 0..9: exact least squares on
    [1, n, features(n)] (what a sub-MLP's bias, skip and W_per can represent)."""
    n = np.arange(domain, dtype=np.float64)
    freqs, _ = frequencies(PERIODS)
    feats = periodic_features(torch.from_numpy(n)[None], freqs.double())[0].numpy().T    # (domain, F)
    A = np.column_stack([np.ones_like(n), n, feats])
    coef, *_ = np.linalg.lstsq(A, table(n), rcond=None)
    assert np.abs(A @ coef - table(n)).max() < 1e-9


def _model(seed=0, replicas=3, **config):
    torch.manual_seed(seed)
    cfg = DTConfig(mlp_periods=PERIODS, replicas=replicas, **config)
    model = DiscreteTransformer(cfg, seq_len=6, n_inputs=2)
    x = torch.randint(0, 30, (5, 6, 2)).double()
    model.fit_normalization(x.numpy(), x.numpy()[..., :1])
    with torch.no_grad():
        for block in model.blocks:
            if block.mlp is not None:
                block.mlp.W_per.normal_()
    return model, model.normalize_inputs(x.float())


@pytest.mark.parametrize("sampling", [Sampling.anneal(2.0, gumbel=False, straight_through=False),
                                      Sampling.hard_phase(0.5), EVAL])
def test_every_cpu_backend_matches_the_float64_reference(sampling, monkeypatch):
    import copy

    model, x = _model(n_layers=2)
    ref = copy.deepcopy(model).double()
    outs = {}
    for backend in ("reference", "native"):
        if backend == "reference":
            monkeypatch.setenv("WTC_KERNELS", "reference")
        else:
            monkeypatch.delenv("WTC_KERNELS", raising=False)
        for m, xx, tag in ((model, x, backend), (ref, x.double(), backend + "64")):
            m.zero_grad()
            y, _ = m(xx, sampling)
            if y.requires_grad:
                y.square().sum().backward()
            grad = m.blocks[0].mlp.W_per.grad
            outs[tag] = (y.detach().double(), None if grad is None else grad.double().clone())
    y64, g64 = outs["reference64"]
    for tag in ("reference", "native", "native64"):
        y, g = outs[tag]
        assert torch.allclose(y, y64, atol=1e-4, rtol=1e-4), tag
        if g64 is not None:
            assert torch.allclose(g, g64, atol=1e-3 * float(g64.abs().max()), rtol=1e-3), tag


def test_routed_values_carry_their_source_units():
    """A frozen model whose sub-MLP reads pointer head L0.h0 (x one step back): the periodic
    part equals W_per . features(previous raw x), computed independently here."""
    model, x = _model(replicas=1, n_layers=1, n_heads=1, n_mlps=1, content_fraction=0.0)
    block = model.blocks[0]
    names = model.variable_names
    with torch.no_grad():
        block.attn.rel.zero_()
        block.attn.abs.zero_()
        block.attn.rel[0, 0, 1] = 30.0
        v = block.attn.select.slot_names.index("L0.h0.v")
        block.attn.select.logits[0, v] = -10.0
        block.attn.select.logits[0, v, names.index("x1")] = 10.0
        for i in range(block.mlp.k):
            block.mlp.select.logits[0, i] = -10.0
            block.mlp.select.logits[0, i, names.index("L0.h0")] = 10.0
    model.freeze()
    model.eval()
    captured = []
    with model.hooks([("blocks.0.mlp.hook_post", lambda out, hook: captured.append(out))]):
        model(x, EVAL)
    raw = model.x_scale[1] * x[..., 1]                                               # (B, T) raw x1
    prev = torch.cat([torch.zeros_like(raw[:, :1]), raw[:, :-1]], 1)
    mlp = block.mlp
    feats = periodic_features(prev, mlp.freqs)                                       # (B, F, T)
    expected = torch.einsum("bft,f->bt", feats, mlp.W_per[0, 0].sum(0))
    inputs = (prev / model.x_scale[1])[None, ..., None, None].expand(1, -1, -1, 1, mlp.k)
    expected = expected + mlp.evaluate(inputs)[0, ..., 0]
    assert torch.allclose(captured[0][0, ..., 0], expected, atol=1e-4)


def test_config_checks_and_round_trip():
    cfg = DTConfig(mlp_periods=[5, 2, 3, 2])
    assert cfg.mlp_periods == (2, 3, 5)
    assert DTConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ((1,), (2.5,), "23", 3, (True,), (65,)):
        with pytest.raises(ConfigError, match="mlp_periods"):
            DTConfig(mlp_periods=bad)


def _planted(task_name: str, cfg: DTConfig, pins: dict[str, str], iters: int):
    """A frozen model of task_name whose read slots read the given variables ({slot: variable};
    a slot "L0.m0.in*" pins every input of the sub-MLP), head refit and polished: (task, model)."""
    task = wtc.tasks.get(task_name)
    run = Attempt(task, cfg, seed=0, attempt=0)
    model = run.model
    names = model.variable_names
    with torch.no_grad():
        for sel in model.selectors():
            for s, slot in enumerate(sel.slot_names):
                var = next((v for pattern, v in pins.items() if fnmatch.fnmatch(slot, pattern)), None)
                if var is not None:
                    sel.logits[0, s] = -10.0
                    sel.logits[0, s, names.index(var)] = 10.0
    model.freeze()
    model.eval()
    x, y, valid, _ = run.fit_data
    refit_head(model, x, y, valid)
    polish(model, x[:512], y[:512], valid[:512], iters=iters)
    return task, model


def test_planted_parity_reads_as_a_modulus_and_survives_a_checkpoint(tmp_path):
    """A frozen model whose one sub-MLP reads x, fitted to is_even: the periodic units fit the
    table exactly, extraction reads `1 - x % 2` (a modulus, not a cosine), the program verifies on
    fresh data, and a reloaded checkpoint in a new process predicts the same."""
    cfg = DTConfig(n_layers=1, n_heads=0, n_mlps=1, replicas=1, mlp_hidden=8, mlp_periods=PERIODS)
    task, model = _planted("is_even", cfg, {"L0.m0.in*": "x"}, iters=200)
    program = extract(model, task)
    assert program.ok, program.failures
    assert "%" in program.source and "cos" not in program.source
    assert verify(program, task, n=5000, seed=3).solved
    wtc.dt.checkpoint.save(model, tmp_path / "m")
    xs = np.random.default_rng(7).integers(0, 100, (20, 10)).astype(float)
    np.save(tmp_path / "x.npy", xs)
    np.save(tmp_path / "p.npy", model.predict(xs))
    code = ("import numpy as np, wtc.dt.checkpoint as c; m = c.load(r'%s'); "
            "assert np.array_equal(m.predict(np.load(r'%s')), np.load(r'%s'))") % (
        tmp_path / "m", tmp_path / "x.npy", tmp_path / "p.npy")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_planted_counter_mod_k_reads_through_the_prefix_sum():
    """cumsum_mod5 = (x_0 + .. + x_t) % 5: an aggregate head averages x, the sub-MLP's periodic
    units read the average as the sum it stands for; extraction finds no formula of the mean, reads
    the aggregate as a prefix sum, and the program (`sum_x % 5`) verifies on fresh data."""
    cfg = DTConfig(n_layers=1, n_heads=0, n_agg_heads=1, n_mlps=1, replicas=1, mlp_hidden=8, mlp_periods=PERIODS)
    task, model = _planted("cumsum_mod5", cfg, {"L0.a0.v": "x", "L0.m0.in*": "L0.a0"}, iters=300)
    program = extract(model, task)
    assert program.ok, program.failures
    assert "sum(x[:t + 1])" in program.source and "% 5" in program.source, program.source
    assert verify(program, task, n=5000, seed=3).solved


@pytest.mark.parametrize("hard", [False, True])
def test_the_folded_periodic_units_equal_their_definition(hard):
    """periodic() folds a soft choice into W_per (one product per replica) and takes a hard
    choice's features of the chosen values only: on fresh random streams, units, choices and
    weights, its outputs and the gradients of the stream, the choice's weights and W_per equal
    periodic_reference()'s (features per variable, read per slot, then weighted) in float64, in
    float32 within its rounding, and a hard choice's outputs are the same float32 numbers."""
    from wtc.dt.selection import Choice

    g = torch.Generator().manual_seed(7 + hard)
    R, B, T, V = 3, 4, 6, 9
    mlp = DiscreteTransformer(DTConfig(mlp_periods=PERIODS, replicas=R), seq_len=T, n_inputs=2).blocks[0].mlp
    S = mlp.M * mlp.k
    for dtype in (torch.float64, torch.float32):
        m = copy.deepcopy(mlp).to(dtype)
        with torch.no_grad():
            m.W_per.copy_(torch.randn(m.W_per.shape, generator=g, dtype=dtype))
        stream = torch.randn(R, B, T, V, generator=g, dtype=dtype).requires_grad_()
        units = torch.rand(R, T, V, generator=g, dtype=dtype) * 20
        if hard:
            choice = Choice(index=torch.randint(0, V, (R, S), generator=g))
        else:
            choice = Choice(weights=torch.softmax(torch.randn(R, S, V, generator=g, dtype=dtype), -1).requires_grad_())
        outs = []
        for fn in (m.periodic, m.periodic_reference):
            for t in (stream, m.W_per, choice.weights):
                if t is not None:
                    t.grad = None
            y = fn(stream, units, choice)
            (y * torch.linspace(-1, 1, y.numel(), dtype=dtype).view(y.shape)).sum().backward()
            outs.append([y.detach().clone()] + [t.grad.clone() for t in (stream, m.W_per, choice.weights) if t is not None])
        for a, b in zip(*outs):
            tol = 1e-12 if dtype == torch.float64 else 1e-4
            assert torch.allclose(a, b, rtol=tol, atol=tol * float(b.abs().max()))
        if hard and dtype == torch.float32:
            assert torch.equal(outs[0][0], outs[1][0])
