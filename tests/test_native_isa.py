"""The native DT kernels' instruction-set copies (csrc/dt_isa.h): each ISA this CPU runs gives the
torch reference's results, forward and backward, on fresh random inputs; WTC_NATIVE_ISA picks the
copy when wtc._C loads, and a value it cannot honour is an error (never a silent fallback); `wtc
backends` reports the choice.

Tolerances as tests/test_fused_step.py: the float32 op against the float64 reference within 1e-5
relative or 4x the error of the float32 reference itself.
"""
import os
import subprocess
import sys

import pytest
import torch

from test_fused_step import close, rel_err, route_run, route_inputs as fused_route_inputs  # the references' tolerances
from wtc import _native
from wtc.dt.attention import route_reference

C = _native.cpu_module()
pytestmark = pytest.mark.skipif(C is None, reason="wtc._C not built")
ISAS = C.dt_isas() if C is not None else []


@pytest.fixture(params=ISAS)
def isa(request):
    """Run the test with the DT kernels set to one ISA, restoring the previous choice after."""
    old = C.dt_isa()
    assert C.set_dt_isa(request.param) == request.param
    try:
        yield request.param
    finally:
        C.set_dt_isa(old)


def route_inputs(rng, R, B, H, T, pad, N):
    inputs = fused_route_inputs(rng, R, B, H, T, pad, N)
    inputs[-1][0] = 0.0        # both paths: per-sequence (content) and 16-lane (position-only)
    return inputs




@pytest.mark.parametrize("mode", ["soft+noise+overlap", "hard-straight-through+noise"])
@pytest.mark.parametrize("shape", [(3, 19, 3, 10, 9, 16), (2, 3, 2, 7, 11, 5)],
                         ids=lambda s: "R{}B{}H{}T{}P{}N{}".format(*s))
def test_route_matches_reference_under_each_isa(rng, isa, shape, mode):
    from wtc.kernels import cpu

    hard = mode.startswith("hard")
    R, B, H, T, pad, N = shape
    inputs = route_inputs(rng, *shape)
    kw = dict(pad=pad, tau=float(rng.uniform(0.3, 2.0)), hard=hard, straight_through=hard,
              seed=int(rng.integers(2**31 - 1)), overlap=not hard)
    weights = [torch.as_tensor(rng.standard_normal((R, B, H, T))), torch.as_tensor(rng.standard_normal((R, B, H, H, T)))]
    ref_out, ref_o, ref_grads = route_run(route_reference, inputs, kw, weights, torch.float64)
    out32, o32, grads32 = route_run(route_reference, inputs, kw, weights, torch.float32)
    out, o_rows, grads = route_run(cpu.route, inputs, kw, weights, torch.float32)
    assert C.dt_isa() == isa
    assert close(out, ref_out, out32)
    if not hard:
        assert close(o_rows, ref_o, o32)
    for name, g, r, r32 in zip(["zq", "zk", "val", "W", "u", "rel", "abs", "scale"], grads, ref_grads, grads32):
        assert g is not None, name
        if float(r.abs().max()) == 0.0:
            assert float(g.abs().max()) == 0.0, name
        else:
            assert close(g, r, r32), name


def bank_reference(x, W1, b1, W2, b2, skip, activation, W_mid=None, b_mid=None):
    """wtc.dt.submlp.SubMLPs.evaluate as a function of its parameters."""
    from wtc.dt.submlp import activate

    h = activate(torch.einsum("rnmk,rmhk->rnmh", x, W1) + b1[:, None], activation)
    if W_mid is not None:
        h = activate(torch.einsum("rnmh,rmgh->rnmg", h, W_mid) + b_mid[:, None], activation)
    return torch.einsum("rnmh,rmh->rnm", h, W2) + b2[:, None] + (x * skip[:, None]).sum(-1)


def bank_run(op, inputs, activation, weight, dtype):
    leaves = [x.to(dtype).requires_grad_() for x in inputs]
    y = op(*leaves[:6], activation, *leaves[6:])
    return y, torch.autograd.grad((y * weight.to(dtype)).sum(), leaves)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("activation", ["relu+silu", "gelu"])
@pytest.mark.parametrize("shape", [(2, 130, 3, 3, 24, 2), (1, 70, 2, 3, 5, 1)],
                         ids=lambda s: "R{}n{}M{}k{}h{}d{}".format(*s))
def test_mlp_bank_matches_reference_under_each_isa(rng, isa, shape, activation, dtype):
    from wtc.kernels import cpu

    R, n, M, k, hidden, depth = shape
    f = lambda *s: torch.as_tensor(rng.standard_normal(s), dtype=torch.float64)  # noqa: E731
    inputs = [f(R, n, M, k), f(R, M, hidden, k), f(R, M, hidden), f(R, M, hidden), f(R, M), f(R, M, k)]
    if depth == 2:
        inputs += [f(R, M, hidden, hidden) / hidden ** 0.5, f(R, M, hidden)]
    weight = torch.as_tensor(rng.standard_normal((R, n, M)))
    y64, g64 = bank_run(bank_reference, inputs, activation, weight, torch.float64)
    y32, g32 = bank_run(bank_reference, inputs, activation, weight, torch.float32)
    y, grads = bank_run(cpu.mlp_bank, inputs, activation, weight, dtype)
    assert C.dt_isa() == isa and y.dtype == dtype
    names = ["y", "x", "W1", "b1", "W2", "b2", "skip", "W_mid", "b_mid"]
    for name, g, r, r32 in zip(names, [y, *grads], [y64, *g64], [y32, *g32]):
        g, r = g.detach(), r.detach()
        if dtype == torch.float64:        # the precision pass's kernel: float64 rounding, every ISA
            assert float((g - r).abs().max()) <= 1e-12 * max(1.0, float(r.abs().max())), name
        else:
            assert close(g, r, r32), name


def test_the_isas_are_widest_first_and_auto_takes_the_widest(isa):
    assert ISAS[-1] == "portable" and set(ISAS) <= {"avx512", "avx2", "portable"}
    assert len(set(ISAS)) == len(ISAS)
    assert C.set_dt_isa("auto") == ISAS[0] == C.dt_isa()


def test_set_dt_isa_rejects_an_unknown_name():
    old = C.dt_isa()
    with pytest.raises(ValueError, match="isa must be auto, portable, avx2 or avx512, got 'sse2'"):
        C.set_dt_isa("sse2")
    assert C.dt_isa() == old


def _in_subprocess(isa_env: str, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, WTC_NATIVE_ISA=isa_env)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ISAS)
def test_the_environment_variable_picks_the_copy_at_load(name):
    done = _in_subprocess(f" {name.upper()} ", "import wtc, wtc._native as n; print(n.dt_isa()); "
                          "print(wtc.backends()[0].why)")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == name
    assert f"DT kernels {name} (CPU runs {', '.join(ISAS)})" in lines[1]


def test_a_bad_environment_value_is_an_error_when_the_kernels_run():
    code = ("import torch, wtc, wtc._native as n\n"
            "from wtc.errors import BackendError\n"
            "from wtc.kernels import cpu\n"
            "print(wtc.backends()[0].why)\n"
            "for call in (n.dt_isa, lambda: cpu.mlp_bank(torch.zeros(1, 2, 1, 1), torch.zeros(1, 1, 3, 1), "
            "torch.zeros(1, 1, 3), torch.zeros(1, 1, 3), torch.zeros(1, 1), torch.zeros(1, 1, 1), 'relu')):\n"
            "    try:\n"
            "        call()\n"
            "    except BackendError as exc:\n"
            "        print('BackendError', exc)\n")
    done = _in_subprocess("avx3", code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    want = "WTC_NATIVE_ISA must be auto, portable, avx2 or avx512, got 'avx3'"
    assert lines[0].endswith(f"DT kernels error: {want}")
    assert lines[1:] == [f"BackendError {want}"] * 2


def test_an_isa_the_cpu_lacks_is_refused_naming_what_it_runs():
    missing = [name for name in ("avx512", "avx2") if name not in ISAS]
    if not missing:
        pytest.skip(f"this CPU runs every DT kernel copy ({', '.join(ISAS)})")
    with pytest.raises(ValueError, match=f"this CPU cannot run \\(it runs: {', '.join(ISAS)}\\)"):
        C.set_dt_isa(missing[0])
    done = _in_subprocess(missing[0], "import wtc._native as n\ntry:\n    n.dt_isa()\nexcept Exception as e:\n"
                          "    print(type(e).__name__, e)")
    assert done.stdout.strip() == (f"BackendError WTC_NATIVE_ISA asks for '{missing[0]}', which this CPU cannot "
                                   f"run (it runs: {', '.join(ISAS)})")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_mlp_bank_exp_clamp_far_in_both_tails_under_each_isa(rng, isa, dtype):
    """Pre-activations far past the exp clamp (|pre| up to ~1000, csrc/dt_isa.h clamp_abs): SiLU still
    matches the reference (its tails are 0 and the identity) and nothing overflows."""
    from wtc.kernels import cpu

    R, n, M, k, hidden = 2, 70, 3, 2, 8
    f = lambda *s: torch.as_tensor(rng.standard_normal(s), dtype=torch.float64)  # noqa: E731
    inputs = [300 * f(R, n, M, k), f(R, M, hidden, k), f(R, M, hidden), f(R, M, hidden), f(R, M), f(R, M, k)]
    weight = torch.as_tensor(rng.standard_normal((R, n, M)))
    y64, g64 = bank_run(bank_reference, inputs, "silu", weight, torch.float64)
    y, grads = bank_run(cpu.mlp_bank, inputs, "silu", weight, dtype)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for name, g, r in zip(["y", "x", "W1", "b1", "W2", "b2", "skip"], [y, *grads], [y64, *g64]):
        g, r = g.detach().double(), r.detach()
        assert torch.isfinite(g).all(), name
        assert float((g - r).abs().max()) <= tol * max(1.0, float(r.abs().max())), name


def test_route_a_nan_score_stays_nan_under_each_isa(rng, isa):
    """The softmax's exp clamp keeps NaN (it does not turn a NaN score into a finite probability)."""
    from wtc.kernels import cpu

    inputs = [x.float() for x in route_inputs(rng, 2, 3, 2, 5, 4, 16)]
    inputs[5][0, 0, 2] = float("nan")      # rel of replica 0 (position-only), head 0
    inputs[5][1, 1, 3] = float("nan")      # rel of replica 1 (content), head 1
    out, _ = cpu.route(*inputs, pad=4, tau=0.8, hard=False, straight_through=False, seed=None)
    # rel[i + pad - j] with pad 4 reaches every query of the head: each of its outputs is NaN
    assert torch.isnan(out[0, :, 0]).all() and torch.isnan(out[1, :, 1]).all()
    assert torch.isfinite(out[0, :, 1]).all() and torch.isfinite(out[1, :, 0]).all()
