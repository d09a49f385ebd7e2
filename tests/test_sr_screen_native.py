"""The linear screen's native loops (wtc._C.screen) against their reference, the numba kernels of
wtc.sr.numba_eval: the same outputs bit for bit on fresh random problems (both compute in float64
without fused multiply-adds), the whole screen() the same under either backend, and a clear error
for every buffer the native loops would otherwise misread."""
import numpy as np
import pytest

from wtc import _native
from wtc.sr import numba_eval
from wtc.sr.screen import kernels, prepare_columns, screen

C = _native.cpu_module()
pytestmark = pytest.mark.skipif(C is None, reason="wtc._C not built")


def _problem(seed: int, N: int, m: int = 64, planted: int = 2):
    """Unit-norm centred columns of N random terms (with exact duplicates and near-collinear pairs
    among them) and a target made of `planted` of them plus noise."""
    rng = np.random.default_rng(seed)
    vals = rng.standard_normal((N, m))
    if N > 4:
        vals[3] = vals[1] * 2.0 + 1.0                       # a linear duplicate
        vals[4] = vals[2] + 1e-6 * rng.standard_normal(m)   # nearly collinear
    pick = rng.choice(N, size=min(planted, N), replace=False)
    y = vals[pick].T @ rng.uniform(0.5, 2.0, len(pick)) + 0.01 * rng.standard_normal(m)
    w = rng.uniform(0.5, 1.5, m)
    U, yc, _ = prepare_columns(vals, y, w)
    sizes = rng.integers(1, 5, len(U))
    return U, yc, sizes


def _buffers(U, yc, sizes, max_lb, n_best=3, n_extend=7, cap=50):
    N = len(U)
    yy = float(yc @ yc)
    b = np.ascontiguousarray(U @ yc)
    G = np.ascontiguousarray(U @ U.T)
    sse1 = yy - b ** 2
    pass1 = sse1 <= np.quantile(sse1, 0.1)
    return dict(G=G, b=b, yy=yy, sizes=np.ascontiguousarray(sizes, dtype=np.int64), pass1=pass1, max_lb=max_lb,
                sse_pass=float(np.quantile(sse1, 0.3)) * 0.5,
                best_sse=np.full((max_lb + 1, n_best), np.inf), best_idx=np.full((max_lb + 1, n_best, 3), -1),
                out2=np.zeros((cap, 2), dtype=np.int64), sse2=np.zeros(cap), PP=np.zeros((N, N), dtype=np.bool_),
                top_sse=np.full(n_extend, np.inf), top_idx=np.full((n_extend, 2), -1, dtype=np.int64),
                out3=np.zeros((cap, 3), dtype=np.int64), sse3=np.zeros(cap), cap=cap)


def _run(K, a):
    """pairs, triples, extend in screen()'s order on copies of the buffers -> every output."""
    a = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in a.items()}
    N = len(a["b"])
    n2 = K.pairs(a["G"], a["b"], a["yy"], a["sizes"], a["sse_pass"], a["max_lb"], a["pass1"], a["best_sse"],
                 a["best_idx"], a["out2"], a["sse2"], a["cap"], a["PP"], a["top_sse"], a["top_idx"])
    T = np.arange(min(N, 9), dtype=np.int64)
    inT = np.zeros(N, dtype=np.bool_)
    inT[T] = True
    n3 = K.triples(a["G"], a["b"], a["yy"], T, a["sizes"], a["sse_pass"], a["max_lb"], a["pass1"], a["PP"],
                   a["best_sse"], a["best_idx"], a["out3"], a["sse3"], 0, a["cap"])
    n3 = K.extend(a["G"], a["b"], a["yy"], a["top_idx"], int(np.isfinite(a["top_sse"]).sum()), inT, a["sizes"],
                  a["sse_pass"], a["max_lb"], a["pass1"], a["PP"], a["best_sse"], a["best_idx"], a["out3"], a["sse3"],
                  n3, a["cap"])
    return n2, n3, {k: v for k, v in a.items() if isinstance(v, np.ndarray)}


@pytest.mark.parametrize("seed", range(6))
def test_native_loops_equal_the_numba_reference_bit_for_bit(seed):
    rng = np.random.default_rng(100 + seed)
    N = int(rng.integers(3, 40))
    U, yc, sizes = _problem(seed, N)
    a = _buffers(U, yc, sizes, max_lb=int(rng.integers(4, 12)), cap=int(rng.integers(1, 60)))
    n2, n3, got = _run(C.screen, a)
    m2, m3, want = _run(numba_eval, a)
    assert (n2, n3) == (m2, m3)
    assert n2 > 0 or n3 > 0 or np.isfinite(want["best_sse"]).any()      # the problem exercised the loops
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_offer_keeps_the_lowest_in_order_ties_first_come():
    best, idx = np.full((2, 3), np.inf), np.full((2, 3, 3), -1)
    ref_best, ref_idx = best.copy(), idx.copy()
    for k, sse in enumerate([5.0, 1.0, 3.0, 1.0, 0.5, 7.0]):
        C.screen._offer(best, idx, 1, sse, k, -1, -1)
        numba_eval._offer(ref_best, ref_idx, 1, sse, k, -1, -1)
    np.testing.assert_array_equal(best, ref_best)
    np.testing.assert_array_equal(idx, ref_idx)
    assert best[1].tolist() == [0.5, 1.0, 1.0] and idx[1, :, 0].tolist() == [4, 1, 3]


@pytest.mark.parametrize("seed", range(3))
def test_screen_is_the_same_under_either_backend(seed, monkeypatch):
    U, yc, sizes = _problem(seed, 30 + 10 * seed, planted=3)
    sse_pass = 0.05 * float(yc @ yc)
    monkeypatch.delenv("WTC_KERNELS", raising=False)
    assert kernels() is C.screen
    native = screen(U, yc, sizes, sse_pass, max_lb=10, n_triple_set=12, n_extend=8)
    monkeypatch.setenv("WTC_KERNELS", "reference")
    assert kernels() is numba_eval
    reference = screen(U, yc, sizes, sse_pass, max_lb=10, n_triple_set=12, n_extend=8)
    assert native == reference
    assert native.passing or native.best


def test_bad_buffers_raise_a_clear_error():
    U, yc, sizes = _problem(0, 12)
    a = _buffers(U, yc, sizes, max_lb=8)
    N = len(a["b"])

    def pairs(**change):
        b = {**a, **change}
        return C.screen.pairs(b["G"], b["b"], b["yy"], b["sizes"], b["sse_pass"], b["max_lb"], b["pass1"],
                              b["best_sse"], b["best_idx"], b["out2"], b["sse2"], b["cap"], b["PP"], b["top_sse"],
                              b["top_idx"])

    with pytest.raises(ValueError, match="G: size"):
        pairs(G=a["G"][:5])
    with pytest.raises(ValueError, match="best_sse must have dtype float64"):
        pairs(best_sse=a["best_sse"].astype(np.float32))
    with pytest.raises(ValueError, match="L > max_lb"):
        pairs(max_lb=40)
    with pytest.raises(ValueError, match="cap must be in"):
        pairs(cap=10_000)
    with pytest.raises(ValueError, match="PP must be C-contiguous"):
        pairs(PP=np.zeros((N, 2 * N), dtype=np.bool_)[:, ::2])
    with pytest.raises(ValueError, match="sizes holds -1"):
        pairs(sizes=np.full(N, -1, dtype=np.int64))
    T = np.array([0, 1, 99], dtype=np.int64)
    with pytest.raises(ValueError, match=rf"T holds 99, outside \[0, {N}\)"):
        C.screen.triples(a["G"], a["b"], a["yy"], T, a["sizes"], a["sse_pass"], a["max_lb"], a["pass1"], a["PP"],
                         a["best_sse"], a["best_idx"], a["out3"], a["sse3"], 0, a["cap"])
    with pytest.raises(ValueError, match="n_out must be in"):
        C.screen.triples(a["G"], a["b"], a["yy"], T[:2], a["sizes"], a["sse_pass"], a["max_lb"], a["pass1"], a["PP"],
                         a["best_sse"], a["best_idx"], a["out3"], a["sse3"], a["cap"] + 1, a["cap"])
    with pytest.raises(ValueError, match="lb must index a row"):
        C.screen._offer(a["best_sse"], a["best_idx"], 9, 1.0, 0, 1, 2)
