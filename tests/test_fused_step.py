"""The DT training step's fast paths against the torch reference they replace.

content_scores: the content term computed only for the replicas that use it equals the full
computation masked by content (bitwise: the skipped replicas were multiplied by 0).
Native ops (wtc.kernels.cpu, float32): outputs and every gradient against the float64 reference on
fresh random inputs, within 1e-5 relative or 4x the error of the float32 reference itself; the
same result for any thread count; a whole attempt trained side by side with the reference.
"""
import numpy as np
import pytest
import torch

from wtc.dt.attention import content_scores
from wtc.dt.ple import ple_uniform


def full_content(zq, zk, W, u, content):
    """What pointer_scores computed before: every replica, then times content."""
    N = W.shape[-1]
    proj = ple_uniform(zq, N) @ W[:, None] + u[:, None, :, None, :]
    return (proj @ ple_uniform(zk, N).transpose(-1, -2)) * content[:, None, None, None, None]


@pytest.mark.parametrize("content", [[0, 0, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]])
def test_content_scores_skip_positional_replicas(rng, content):
    torch.manual_seed(int(rng.integers(1 << 31)))
    R, B, H, T, P, N = 4, 3, 2, 5, 4, 7
    zq = torch.rand(R, B, H, T, requires_grad=True)
    zk = torch.rand(R, B, H, T + P, requires_grad=True)
    W = torch.randn(R, H, N, N, requires_grad=True)
    u = torch.randn(R, H, N, requires_grad=True)
    c = torch.tensor(content, dtype=torch.float32)
    ours = content_scores(zq, zk, W, u, c)
    ref = full_content(zq, zk, W, u, c)
    assert torch.equal(ours, ref)
    g = torch.randn_like(ref)
    leaves = (zq, zk, W, u)
    if not c.any():   # nothing depends on the inputs any more
        assert not ours.requires_grad or torch.equal(ours, torch.zeros_like(ours))
        return
    ga = torch.autograd.grad(ours, leaves, g)
    gb = torch.autograd.grad(ref, leaves, g)
    for a, b in zip(ga, gb):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- native routing (wtc.kernels.cpu.route)
import numpy as np  # noqa: E402

from wtc import _native  # noqa: E402
from wtc.dt.attention import route_reference  # noqa: E402

C = _native.cpu_module()
needs_native = pytest.mark.skipif(C is None, reason="wtc._C not built")
TOL = 1e-5

ROUTE_SHAPES = [  # R, B, H, T, pad, bins
    (2, 3, 2, 5, 4, 5),
    (1, 2, 3, 19, 18, 16),    # keys past one padded block of 16
    (1, 2, 1, 1, 0, 1),       # T = L = 1, one bin
    (2, 1, 2, 7, 0, 3),       # no pads
    (3, 5, 3, 10, 9, 16),     # the default DT's shape (smaller batch), mixed content
    (2, 2, 2, 6, 11, 7),      # more pads than positions, odd bins
    (2, 3, 2, 5, 4, 20),      # more bins than one block of 16 (the projection's tail block)
]
ROUTE_MODES = {  # hard, straight_through, noise, overlap
    "soft": (False, False, False, False),
    "soft+noise": (False, False, True, False),
    "soft+noise+overlap": (False, False, True, True),
    "hard-straight-through": (True, True, False, False),
    "hard-straight-through+noise": (True, True, True, False),
    "hard-eval": (True, False, False, False),
}


def rel_err(got, ref):
    got, ref = got.detach().double(), ref.detach().double()
    assert torch.isfinite(got).all()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def close(got, ref64, ref32) -> bool:
    """float32 op vs the float64 reference, allowing what float32 itself costs on these inputs."""
    return rel_err(got, ref64) <= max(TOL, 4 * rel_err(ref32, ref64))


def route_inputs(rng, R, B, H, T, pad, N):
    L = T + pad
    f = lambda *s: torch.as_tensor(rng.standard_normal(s), dtype=torch.float64)  # noqa: E731
    u01 = lambda *s: torch.as_tensor(rng.random(s), dtype=torch.float64)  # noqa: E731
    content = torch.as_tensor(rng.random(R) < 0.6, dtype=torch.float64)
    content[-1] = 1.0
    return [u01(R, B, H, T), u01(R, B, H, L), f(R, B, H, L), 0.3 * f(R, H, N, N), 0.3 * f(R, H, N), f(R, H, L),
            f(R, H, L), u01(R, H) + 0.5, content]


def route_run(op, inputs, kw, weights, dtype):
    leaves = [x.to(dtype).requires_grad_() for x in inputs[:8]]
    out, o_rows = op(*leaves, inputs[8].to(dtype), **kw)
    loss = (out * weights[0].to(dtype)).sum()
    if o_rows is not None:
        loss = loss + (o_rows * weights[1].to(dtype)).sum()
    return out, o_rows, torch.autograd.grad(loss, leaves, allow_unused=True)


@needs_native
@pytest.mark.parametrize("mode", list(ROUTE_MODES))
@pytest.mark.parametrize("shape", ROUTE_SHAPES, ids=lambda s: "R{}B{}H{}T{}P{}N{}".format(*s))
def test_native_route_matches_float64_reference(rng, shape, mode):
    from wtc.kernels import cpu

    hard, st, noise, overlap = ROUTE_MODES[mode]
    R, B, H, T, pad, N = shape
    if overlap and H < 2:
        pytest.skip("overlaps need two heads")
    inputs = route_inputs(rng, *shape)
    kw = dict(pad=pad, tau=float(rng.uniform(0.3, 2.0)), hard=hard, straight_through=st,
              seed=int(rng.integers(2**31 - 1)) if noise else None, overlap=overlap)
    weights = [torch.as_tensor(rng.standard_normal((R, B, H, T))), torch.as_tensor(rng.standard_normal((R, B, H, H, T)))]
    ref_out, ref_o, ref_grads = route_run(route_reference, inputs, kw, weights, torch.float64)
    out32, o32, grads32 = route_run(route_reference, inputs, kw, weights, torch.float32)
    out, o_rows, grads = route_run(cpu.route, inputs, kw, weights, torch.float32)
    assert out.shape == (R, B, H, T) and out.dtype == torch.float32
    assert close(out, ref_out, out32)
    if overlap:
        assert close(o_rows, ref_o, o32)
    else:
        assert o_rows is None
    for name, g, r, r32 in zip(["zq", "zk", "val", "W", "u", "rel", "abs", "scale"], grads, ref_grads, grads32):
        if r is None:                  # hard eval: no gradient reaches the scores
            assert g is None or float(g.abs().max()) == 0.0, name
            continue
        assert g is not None, name
        if float(r.abs().max()) == 0.0:
            assert float(g.abs().max()) == 0.0, name
        else:
            assert close(g, r, r32), name


@needs_native
def test_native_route_is_the_same_for_any_thread_count(rng):
    from wtc.kernels import cpu

    inputs = [x.float() for x in route_inputs(rng, 3, 7, 3, 10, 9, 16)]
    kw = dict(pad=9, tau=0.7, hard=False, straight_through=False, seed=1234, overlap=True)
    weights = [torch.randn(3, 7, 3, 10), torch.randn(3, 7, 3, 3, 10)]
    runs = []
    for threads in (1, 2, 3):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            runs.append(route_run(cpu.route, inputs, kw, weights, torch.float32))
        finally:
            torch.set_num_threads(old)
    for other in runs[1:]:
        assert torch.equal(other[0], runs[0][0]) and torch.equal(other[1], runs[0][1])
        assert all(torch.equal(a, b) for a, b in zip(other[2], runs[0][2]))


@needs_native
@pytest.mark.parametrize("mode", ["soft+noise+overlap", "hard-straight-through+noise", "hard-eval"])
@pytest.mark.parametrize("shape", ROUTE_SHAPES, ids=lambda s: "R{}B{}H{}T{}P{}N{}".format(*s))
def test_native_route_backward_from_the_kept_forward_is_the_recomputed_one(rng, shape, mode, monkeypatch):
    """The forward keeps its scores and probabilities for the backward (ROUTE_KEEP_BYTES); above the
    bound the backward recomputes them. Both give the same bits, in every mode and shape."""
    from wtc.kernels import cpu

    hard, st, noise, overlap = ROUTE_MODES[mode]
    R, B, H, T, pad, N = shape
    overlap = overlap and H > 1
    inputs = route_inputs(rng, *shape)
    kw = dict(pad=pad, tau=0.8, hard=hard, straight_through=st, seed=987 if noise else None, overlap=overlap)
    weights = [torch.randn(R, B, H, T, dtype=torch.float64), torch.randn(R, B, H, H, T, dtype=torch.float64)]
    kept = route_run(cpu.route, inputs, kw, weights, torch.float32)
    monkeypatch.setattr(cpu, "ROUTE_KEEP_BYTES", 0)
    recomputed = route_run(cpu.route, inputs, kw, weights, torch.float32)
    assert torch.equal(kept[0], recomputed[0])
    for a, b in zip(kept[2], recomputed[2]):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


@needs_native
def test_native_route_refuses_a_kept_forward_of_other_inputs(rng):
    from wtc import _native

    C = _native.cpu_module()
    x = [t.float().numpy() for t in route_inputs(rng, 2, 3, 2, 5, 4, 5)]
    *_, kept = C.dt_route_forward(*x, 4, 1.0, False, -1, False, False, 1, 2**30)
    assert kept.ndim == 1 and kept.size > 0
    assert C.dt_route_forward(*x, 4, 1.0, False, -1, False, False, 1, 4 * kept.size - 1)[-1].size == 0   # over the bound
    assert C.dt_route_forward(*x, 4, 1.0, False, -1, False, False, 1, 4 * kept.size)[-1].size == kept.size
    dout = np.ones((2, 3, 2, 5), np.float32)
    with pytest.raises(ValueError, match="saved must be the float32 array dt_route_forward kept"):
        C.dt_route_backward(*x, 4, 1.0, False, -1, dout, None, True, 1, kept[:-1])


@needs_native
def test_native_route_noise_is_the_counter_based_hash(rng):
    """With the scores all equal, the hard pointer is the argmax of the noise: the same bits as
    wtc.dt.gumbel.gumbel_hash (what the reference and the Triton kernel use)."""
    from wtc.dt.gumbel import gumbel_hash
    from wtc.kernels import cpu

    R, B, H, T, pad, N = 2, 3, 2, 6, 5, 4
    L = T + pad
    z = torch.zeros
    val = torch.arange(L, dtype=torch.float32).expand(R, B, H, L).contiguous()
    out, _ = cpu.route(z(R, B, H, T), z(R, B, H, L), val, z(R, H, N, N), z(R, H, N), z(R, H, L), z(R, H, L),
                       torch.ones(R, H), torch.ones(R), pad=pad, tau=1.0, hard=True, straight_through=False, seed=99)
    g = gumbel_hash(99, (R, B, H, T, L), native=False)
    causal = torch.arange(L)[None, :] <= torch.arange(T)[:, None] + pad
    want = g.masked_fill(~causal, float("-inf")).argmax(-1).float()
    assert torch.equal(out, want)


@needs_native
@pytest.mark.parametrize("shape", [(3, 4, 3, 10, 9, 16), (1, 2, 1, 1, 0, 1), (2, 3, 2, 7, 11, 5)])
def test_native_route_entropy_is_the_logged_statistic(rng, shape):
    """entropy=True: what the training log computes from the reference scores,
    entropy(softmax(pointer_scores / tau)), noise-free, per query."""
    from wtc.dt.attention import pointer_scores
    from wtc.dt.selection import entropy
    from wtc.kernels import cpu

    inputs = route_inputs(rng, *shape)
    pad, tau = shape[4], 0.37
    x32 = [x.float() for x in inputs]
    out, _, ent = cpu.route(*x32, pad=pad, tau=tau, hard=False, straight_through=False, seed=5, entropy=True)
    plain, _ = cpu.route(*x32, pad=pad, tau=tau, hard=False, straight_through=False, seed=5)
    assert torch.equal(out, plain) and ent.shape == out.shape and not ent.requires_grad
    ref = entropy(torch.softmax(pointer_scores(*inputs[:2], *inputs[3:9], pad) / tau, -1))   # (no val)
    assert float((ent.double() - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))


@needs_native
def test_native_route_rejects_bad_input():
    from wtc.kernels import cpu

    z = torch.rand(1, 1, 1, 3)
    k = torch.rand(1, 1, 1, 5)
    params = [torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2), torch.zeros(1, 1, 5), torch.zeros(1, 1, 5),
              torch.ones(1, 1), torch.ones(1)]
    with pytest.raises(ValueError, match="tau"):
        cpu.route(z, k, k, *params, pad=2, tau=0.0, hard=False, straight_through=False, seed=None)
    with pytest.raises(ValueError, match="T \\+ pad"):
        cpu.route(z, k, k, *params, pad=1, tau=1.0, hard=False, straight_through=False, seed=None)
    with pytest.raises(ValueError, match="soft"):
        cpu.route(z, k, k, *params, pad=2, tau=1.0, hard=True, straight_through=True, seed=1, overlap=True)
    with pytest.raises(ValueError, match="val: size 4 on axis 3"):
        cpu.route(z, k, k[..., :4], *params, pad=2, tau=1.0, hard=False, straight_through=False, seed=None)
    bad = list(params)
    bad[0] = torch.zeros(1, 2, 2, 2)
    with pytest.raises(ValueError, match="W: size 2 on axis 1"):
        cpu.route(z, k, k, *bad, pad=2, tau=1.0, hard=False, straight_through=False, seed=None)


# ---------------------------------------------------------------- native sub-MLP bank (wtc.kernels.cpu.mlp_bank)
def bank_reference(x, W1, b1, W2, b2, skip, activation, W_mid=None, b_mid=None):
    """wtc.dt.submlp.SubMLPs.evaluate as a function of its parameters."""
    from wtc.dt.submlp import activate

    h = activate(torch.einsum("rnmk,rmhk->rnmh", x, W1) + b1[:, None], activation)
    if W_mid is not None:
        h = activate(torch.einsum("rnmh,rmgh->rnmg", h, W_mid) + b_mid[:, None], activation)
    return torch.einsum("rnmh,rmh->rnm", h, W2) + b2[:, None] + (x * skip[:, None]).sum(-1)


def bank_inputs(rng, R, n, M, k, hidden, depth):
    f = lambda *s: torch.as_tensor(rng.standard_normal(s), dtype=torch.float64)  # noqa: E731
    inputs = [f(R, n, M, k), f(R, M, hidden, k), f(R, M, hidden), f(R, M, hidden), f(R, M), f(R, M, k)]
    if depth == 2:
        inputs += [f(R, M, hidden, hidden) / hidden ** 0.5, f(R, M, hidden)]
    return inputs


def bank_run(op, inputs, activation, weight, dtype):
    leaves = [x.to(dtype).requires_grad_() for x in inputs]
    y = op(*leaves[:6], activation, *leaves[6:])
    return y, torch.autograd.grad((y * weight.to(dtype)).sum(), leaves)


@needs_native
@pytest.mark.parametrize("activation", ["relu+silu", "relu", "silu", "gelu", "tanh"])
@pytest.mark.parametrize("shape", [(2, 37, 3, 2, 6, 1), (1, 1, 1, 1, 2, 1), (2, 130, 3, 3, 24, 2),
                                   (3, 200, 3, 2, 24, 1), (1, 70, 2, 3, 5, 2), (2, 64, 1, 1, 7, 2)],
                         ids=lambda s: "R{}n{}M{}k{}h{}d{}".format(*s))
def test_native_mlp_bank_matches_float64_reference(rng, activation, shape):
    from wtc.kernels import cpu

    R, n, M, k, hidden, depth = shape
    inputs = bank_inputs(rng, *shape)
    weight = torch.as_tensor(rng.standard_normal((R, n, M)))
    y64, g64 = bank_run(bank_reference, inputs, activation, weight, torch.float64)
    y32, g32 = bank_run(bank_reference, inputs, activation, weight, torch.float32)
    y, grads = bank_run(cpu.mlp_bank, inputs, activation, weight, torch.float32)
    assert y.shape == (R, n, M) and y.dtype == torch.float32
    assert close(y, y64, y32)
    assert len(grads) == len(g64) == 6 + (2 if depth == 2 else 0)
    for name, g, r, r32 in zip(["x", "W1", "b1", "W2", "b2", "skip", "W_mid", "b_mid"], grads, g64, g32):
        assert close(g, r, r32), name


@needs_native
@pytest.mark.parametrize("activation", ["relu+silu", "relu", "silu", "gelu", "tanh"])
@pytest.mark.parametrize("shape", [(2, 37, 3, 2, 6, 1), (1, 1, 1, 1, 2, 1), (2, 130, 3, 3, 24, 2),
                                   (1, 70, 2, 3, 5, 2)], ids=lambda s: "R{}n{}M{}k{}h{}d{}".format(*s))
def test_native_mlp_bank_float64_matches_reference_to_float64_rounding(rng, activation, shape):
    """The float64 kernel (the precision pass's L-BFGS) is the float64 reference to ~1e-13, not to
    float32 noise: its own exp is within an ulp or two of the library's."""
    from wtc.kernels import cpu

    R, n, M, k, hidden, depth = shape
    inputs = [x * 4 for x in bank_inputs(rng, *shape)]           # wide pre-activations: silu far into both tails
    weight = torch.as_tensor(rng.standard_normal((R, n, M)))
    y64, g64 = bank_run(bank_reference, inputs, activation, weight, torch.float64)
    y, grads = bank_run(cpu.mlp_bank, inputs, activation, weight, torch.float64)
    assert y.dtype == torch.float64 and all(g.dtype == torch.float64 for g in grads)
    for name, g, r in zip(["y", "x", "W1", "b1", "W2", "b2", "skip", "W_mid", "b_mid"], [y, *grads], [y64, *g64]):
        g, r = g.detach(), r.detach()
        assert float((g - r).abs().max()) <= 1e-12 * max(1.0, float(r.abs().max())), name


@needs_native
def test_native_mlp_bank_runs_float64_only_when_every_operand_is_float64(rng):
    from wtc.backend import choose

    x = torch.zeros(2, 3, dtype=torch.float64)
    assert choose("dt.mlp_bank", x) == "native"
    assert choose("dt.mlp_bank", x, dtype=(torch.float64, torch.float32)) == "reference"
    assert choose("dt.route", x) == "reference"           # the route kernel stays float32-only


@needs_native
def test_native_mlp_bank_takes_any_leading_shape_and_any_thread_count(rng):
    from wtc.kernels import cpu

    inputs = [x.float() for x in bank_inputs(rng, 3, 6 * 11, 3, 2, 24, 2)]
    x = inputs[0].reshape(3, 6, 11, 3, 2)          # (R, B, T, M, k), as SubMLPs passes them
    outs = []
    for threads in (1, 2, 3):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            leaves = [t.clone().requires_grad_() for t in [x] + inputs[1:]]
            y = cpu.mlp_bank(*leaves[:6], "relu+silu", *leaves[6:])
            outs.append((y, torch.autograd.grad(y.square().sum(), leaves)))
        finally:
            torch.set_num_threads(old)
    assert outs[0][0].shape == (3, 6, 11, 3)
    ref = bank_reference(inputs[0], *inputs[1:6], "relu+silu", *inputs[6:]).reshape(3, 6, 11, 3)
    assert torch.allclose(outs[0][0], ref, atol=1e-5)
    for y, grads in outs[1:]:
        assert torch.equal(y, outs[0][0]) and all(torch.equal(a, b) for a, b in zip(grads, outs[0][1]))


@needs_native
def test_native_mlp_bank_rejects_bad_input():
    from wtc.kernels import cpu

    z = torch.zeros
    args = [z(1, 4, 2, 2), z(1, 2, 3, 2), z(1, 2, 3), z(1, 2, 3), z(1, 2), z(1, 2, 2)]
    cpu.mlp_bank(*args, "relu")
    with pytest.raises(ValueError, match="activation"):
        cpu.mlp_bank(*args, "swish")
    with pytest.raises(ValueError, match="W_mid and b_mid"):
        cpu.mlp_bank(*args, "relu", W_mid=z(1, 2, 3, 3))
    bad = list(args)
    bad[3] = z(1, 2, 4)
    with pytest.raises(ValueError, match="W2: size 4 on axis 2"):
        cpu.mlp_bank(*bad, "relu")
    with pytest.raises(ValueError, match="W_mid: size 2 on axis 3"):
        cpu.mlp_bank(*args, "relu", W_mid=z(1, 2, 3, 2), b_mid=z(1, 2, 3))


# ---------------------------------------------------------------- whole training steps
@needs_native
@pytest.mark.parametrize("config", ["default", "straight-through", "rung 1"])
def test_training_trajectory_native_matches_reference(monkeypatch, config):
    """The same attempt trained twice side by side, once with the native ops and once with the
    torch reference (WTC_KERNELS=reference: the torch Gumbel expression too); after every step
    (anneal, with the 1-in-10 logging steps, then hard) the parameters agree to float32 noise."""
    import wtc
    from wtc.dt import DTConfig
    from wtc.dt.attempt import Attempt
    from wtc.kernels import cpu

    calls, native_route, native_bank = [], cpu.route, cpu.mlp_bank
    monkeypatch.setattr(cpu, "route", lambda *a, **k: calls.append(1) or native_route(*a, **k))
    monkeypatch.setattr(cpu, "mlp_bank", lambda *a, **k: calls.append(2) or native_bank(*a, **k))
    base = DTConfig().rung(1)[1] if config == "rung 1" else DTConfig()   # rung 1: 3-input, 2-layer sub-MLPs
    cfg = base.replace(steps=25, hard_steps=8, batch_size=32, straight_through=config == "straight-through")
    task = wtc.tasks.get("parity_last2")
    ref, run = Attempt(task, cfg, seed=3, attempt=0), Attempt(task, cfg, seed=3, attempt=0)
    worst = 0.0
    for step in range(cfg.steps + cfg.hard_steps):
        monkeypatch.setenv("WTC_KERNELS", "reference")
        n = len(calls)
        ref.train_step()
        assert len(calls) == n
        monkeypatch.delenv("WTC_KERNELS")
        phase = run.phase
        run.train_step()
        ran = calls[n:]
        assert 2 in ran, step
        if phase == "hard" or not cfg.straight_through:   # straight-through anneal: overlaps need the reference
            assert 1 in ran, step
        for (name, a), b in zip(run.model.named_parameters(), ref.model.parameters()):
            a, b = a.detach(), b.detach()
            diff = float((a - b).abs().max())
            worst = max(worst, diff)
            assert diff <= 1e-5 + 1e-4 * float(b.abs().max()), (step, name, diff)
    assert worst > 0.0          # two different implementations: not bitwise, only close
    np.testing.assert_allclose(run.history.loss, ref.history.loss, rtol=1e-4, atol=1e-7)
