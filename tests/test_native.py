import numpy as np
import pytest
import torch

from wtc import _native
from wtc.dt import DTConfig, DiscreteTransformer
from wtc.dt.ple import ple

C = _native.cpu_module()
needs_native = pytest.mark.skipif(C is None, reason="wtc._C not built")


def reference_route(q, k, v, qb, kb, W, u, rel, abs_, offset):
    """Torch float64 reference of wtc._C.route_hard: scores, then first argmax."""
    q, k, v, qb, kb, W, u, rel, abs_ = (torch.tensor(a, dtype=torch.float64) for a in (q, k, v, qb, kb, W, u, rel, abs_))
    G, N, Lq = q.shape
    Lk = k.shape[2]
    eq = ple(q, qb[:, None, None])                                        # (G, N, Lq, nq)
    ek = ple(k, kb[:, None, None])                                        # (G, N, Lk, nk)
    s = torch.einsum("gnia,gab,gnjb->gnij", eq, W, ek) + torch.einsum("gnjb,gb->gnj", ek, u)[:, :, None]
    i = torch.arange(Lq)[:, None] + offset
    j = torch.arange(Lk)[None]
    off = i - j
    relv = torch.where(off < rel.shape[1], rel[:, off.clamp(0, rel.shape[1] - 1)], torch.zeros(()))
    s = s + relv[:, None] + abs_[:, None, None]
    s = s.masked_fill(~(j <= i), float("-inf"))
    idx = s.argmax(-1)
    top2 = s.topk(min(2, Lk), dim=-1).values
    return idx.numpy(), torch.gather(v, 2, idx).numpy(), s, top2


def random_route_inputs(rng, G, N, Lq, Lk, nq, nk, n_rel):
    """(q, k, v, q_bins, k_bins, W, u, rel, abs) float32, bins strictly increasing."""
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    qb = np.sort(f(G, nq + 1), axis=1) + np.arange(nq + 1, dtype=np.float32) * 1e-2
    kb = np.sort(f(G, nk + 1), axis=1) + np.arange(nk + 1, dtype=np.float32) * 1e-2
    return f(G, N, Lq), f(G, N, Lk), f(G, N, Lk), qb, kb, f(G, nq, nk), f(G, nk), f(G, n_rel), f(G, Lk)


@needs_native
@pytest.mark.parametrize("G,N,Lq,Lk,nq,nk,n_rel,offset", [
    (1, 1, 1, 1, 1, 1, 1, 0), (3, 17, 10, 19, 16, 16, 19, 9), (2, 5, 7, 7, 3, 5, 4, 0), (4, 33, 6, 9, 8, 2, 9, 3),
])
def test_route_hard_matches_reference(rng, G, N, Lq, Lk, nq, nk, n_rel, offset):
    q, k, v, qb, kb, W, u, rel, abs_ = random_route_inputs(rng, G, N, Lq, Lk, nq, nk, n_rel)
    idx, val, margin = C.route_hard(q, k, v, qb, kb, W, u, rel, abs_, offset)
    ref_idx, ref_val, s, top2 = reference_route(q, k, v, qb, kb, W, u, rel, abs_, offset)
    ref_margin = (top2[..., 0] - top2[..., 1]).numpy() if Lk > 1 else np.full(idx.shape, np.inf)
    clear = ref_margin > 1e-4          # float32 vs float64 may only disagree on near-ties
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(idx[clear], ref_idx[clear])
    np.testing.assert_array_equal(val[clear], ref_val[clear].astype(np.float32))
    finite = np.isfinite(ref_margin)
    np.testing.assert_allclose(margin[finite], ref_margin[finite], rtol=1e-3, atol=1e-3)
    assert np.all(np.isinf(margin[~finite]))
    # causality: the pointer never looks past its own position
    assert np.all(idx <= np.arange(Lq)[None, None] + offset)


@needs_native
def test_route_hard_rejects_bad_shapes():
    z = np.zeros
    args = [z((1, 2, 3)), z((1, 2, 4)), z((1, 2, 4)), z((1, 3)), z((1, 3)), z((1, 2, 2)), z((1, 2)), z((1, 4)), z((1, 4))]
    C.route_hard(*[a.astype(np.float32) for a in args], 1)
    bad = list(args)
    bad[2] = z((1, 2, 5))
    with pytest.raises(ValueError, match="v: size 5 on axis 2"):
        C.route_hard(*bad, 1)
    with pytest.raises(ValueError, match="q_offset"):
        C.route_hard(*args, 2)
    bad = list(args)
    bad[5] = z((1, 2))
    with pytest.raises(ValueError, match=r"W must have shape \(G, nq, nk\)"):
        C.route_hard(*bad, 1)


@needs_native
def test_frozen_model_native_routing_equals_reference(rng, monkeypatch):
    torch.manual_seed(int(rng.integers(1 << 31)))
    cfg = DTConfig(n_layers=2, n_heads=3, n_mlps=2, replicas=3)
    model = DiscreteTransformer(cfg, seq_len=8, n_inputs=2)
    with torch.no_grad():
        for b in model.blocks:   # large random scores so pointers are well separated
            for p in (b.attn.W, b.attn.u, b.attn.rel, b.attn.abs):
                p.normal_(0, 10)
    model.freeze()
    x = rng.uniform(-1, 1, (64, 8, 2))
    monkeypatch.setenv("WTC_KERNELS", "reference")
    ref = model.predict(x, replica=-1)
    monkeypatch.setenv("WTC_KERNELS", "native")
    nat = model.predict(x, replica=-1)
    close = np.isclose(nat, ref, rtol=1e-4, atol=1e-4)
    assert close.mean() > 0.99   # rare near-ties may route differently in float32


@pytest.mark.parametrize("shape", [(2, 3, 2, 5, 9), (1, 1, 1, 1, 1), (1, 2, 3, 17, 33)])
def test_native_gumbel_noise_matches_torch_twin(rng, shape):
    from wtc.dt.gumbel import gumbel_hash
    seed = int(rng.integers(2**31 - 1))
    native = gumbel_hash(seed, shape, native=True)
    torch_twin = gumbel_hash(seed, shape, native=False)
    assert native.shape == torch_twin.shape and torch.isfinite(native).all()
    # same hash bits; only the two float32 logs differ (fast-math, vectorised)
    assert float((native - torch_twin).abs().max()) <= 1e-5 * max(1.0, float(torch_twin.abs().max()))
    with pytest.raises(ValueError, match="seed"):
        C.gumbel_hash(-1, 1, 1, 1)
