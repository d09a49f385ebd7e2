"""ACE Gramians through wtc._C against the torch float64 reference; Chan's centred merge on a
large-mean case; bad chunks; the randomized balanced SVD against the exact one."""
import os

import numpy as np
import pytest
import torch

from wtc import _native
from wtc.ace import GramianAccumulator, balanced_svd, projector_overlap
from wtc.ace.balanced import balanced_energy, rank_for_energy

C = _native.cpu_module()
needs_native = pytest.mark.skipif(C is None, reason="wtc._C not built")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (normwise: off-diagonal entries of a scatter are small next to it)."""
    return float((a - b).abs().max() / b.abs().max())


def kernels():
    out = []
    for k in ("portable", "avx2", "avx512"):
        try:
            C.gramian_kernel(k)
            out.append(k)
        except ValueError:
            pass
    return out


def feed(acc, H, J, sizes):
    start = 0
    for size in sizes:
        acc.add(H[start:start + size], J[start:start + size])
        start += size
    assert start == len(H)
    return acc


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("D,K", [(37, 1), (129, 3), (1031, 1)])    # 1031 > 1024: the blocks-of-C path
def test_native_equals_reference(gen, dtype, D, K):
    n = 700 if D < 1000 else 260
    H = (torch.randn(n, D, generator=gen, dtype=torch.float64) * 2 + 3).to(dtype)
    J = torch.randn(n, K, D, generator=gen, dtype=torch.float64).to(dtype)
    sizes = [1, 250, 3, n - 254]                                  # a chunk of one sample too
    nat = feed(GramianAccumulator(D, backend="native"), H, J, sizes)
    ref = feed(GramianAccumulator(D, backend="reference"), H, J, sizes)
    assert nat.n == ref.n == n
    assert rel_err(nat.mean, ref.mean) < 1e-12
    assert rel_err(nat.covariance(), ref.covariance()) < 1e-12
    assert rel_err(nat.observability(), ref.observability()) < 1e-12
    # and both equal the definitions on the whole sample
    H64, J64 = H.double(), J.double().reshape(-1, D)
    assert rel_err(nat.covariance(), torch.cov(H64.T)) < 1e-12
    assert rel_err(nat.observability(), J64.T @ J64 / n) < 1e-12
    torch.testing.assert_close(nat.covariance(), nat.covariance().T, rtol=0, atol=0)


@needs_native
def test_every_kernel_and_strided_inputs_agree(gen):
    D, K, n = 45, 2, 333
    H = torch.randn(n, D, generator=gen) + 1
    J = torch.randn(n, K, D, generator=gen)
    ref = feed(GramianAccumulator(D, backend="reference"), H, J, [100, 233])
    Ht = H.T.contiguous().T                                       # column-major: strided rows
    Jt = J.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    assert not Ht.is_contiguous() and not Jt.is_contiguous()
    for kernel in kernels():
        mean, m2, jj = np.zeros(D), np.zeros((D, D)), np.zeros((D, D))
        seen = 0
        for lo, hi in ((0, 100), (100, n)):
            seen = C.gramian_update(Ht[lo:hi].numpy(), Jt[lo:hi].numpy(), mean, m2, jj, seen, kernel)
        assert seen == n
        sym = lambda M: torch.from_numpy(np.triu(M) + np.triu(M, 1).T)
        assert rel_err(sym(m2) / (n - 1), ref.covariance()) < 1e-12, kernel
        assert rel_err(sym(jj) / n, ref.observability()) < 1e-12, kernel
        assert rel_err(torch.from_numpy(mean), ref.mean) < 1e-12, kernel


@needs_native
def test_streaming_equals_one_shot(gen):
    D, K, n = 64, 2, 1000
    H, J = torch.randn(n, D, generator=gen), torch.randn(n, K, D, generator=gen)
    one = GramianAccumulator(D, backend="native")
    one.add(H, J)
    many = feed(GramianAccumulator(D, backend="native"), H, J, [7] * 100 + [300])
    assert rel_err(many.covariance(), one.covariance()) < 1e-13
    assert rel_err(many.observability(), one.observability()) < 1e-13
    assert rel_err(many.mean, one.mean) < 1e-13
    assert rel_err(many.sum_hh, H.double().T @ H.double()) < 1e-12


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_centred_merge_survives_a_large_mean(gen, backend):
    """|mean| / std = 1e6: sum h h^T - n mean mean^T keeps ~4 digits; the centred merge keeps ~all."""
    if backend == "native" and C is None:
        pytest.skip("wtc._C not built")
    D, n = 9, 4000
    A = torch.randn(D, D, generator=gen, dtype=torch.float64)
    H = 1e6 + torch.randn(n, D, generator=gen, dtype=torch.float64) @ A
    J = torch.randn(n, 1, D, generator=gen, dtype=torch.float64)
    acc = feed(GramianAccumulator(D, backend=backend), H, J, [500] * 8)
    Hc = H - H.mean(0)
    exact = Hc.T @ Hc / (n - 1)                                   # two-pass
    mu = H.mean(0)
    raw = (H.T @ H - n * torch.outer(mu, mu)) / (n - 1)           # the one-pass raw formula
    assert rel_err(acc.covariance(), exact) < 1e-9
    assert rel_err(raw, exact) > 1e-6                             # what centring buys


@needs_native
def test_bad_chunks_raise_and_leave_the_state_alone(gen):
    D = 6
    acc = GramianAccumulator(D, backend="native")
    H, J = torch.randn(20, D, generator=gen), torch.randn(20, 2, D, generator=gen)
    acc.add(H[:10], J[:10])
    cov, obs, mean = acc.covariance(), acc.observability(), acc.mean
    bad_h = H[10:].clone()
    bad_h[3, 4] = float("nan")
    with pytest.raises(ValueError, match=r"activations h hold NaN/inf at \(row 3, column 4\)"):
        acc.add(bad_h, J[10:])
    bad_j = J[10:].clone()
    bad_j[5, 1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"Jacobians J hold NaN/inf at \(sample 5, output 1, column 2\)"):
        acc.add(H[10:], bad_j)
    assert acc.n == 10
    torch.testing.assert_close(acc.covariance(), cov, rtol=0, atol=0)
    torch.testing.assert_close(acc.observability(), obs, rtol=0, atol=0)
    torch.testing.assert_close(acc.mean, mean, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"activations must be \(n, 6\)"):
        acc.add(H[:, :5], J)
    with pytest.raises(ValueError, match=r"Jacobians must be \(n, K, 6\) with n = 20"):
        acc.add(H, J[:19])
    with pytest.raises(ValueError, match="dim must be a positive int"):
        GramianAccumulator(0)
    with pytest.raises(ValueError, match="backend must be one of"):
        GramianAccumulator(3, backend="gpu")


@needs_native
def test_native_binding_names_the_problem():
    D = 4
    h, J = np.zeros((3, D)), np.zeros((3, 1, D))
    state = lambda: (np.zeros(D), np.zeros((D, D)), np.zeros((D, D)))
    with pytest.raises(ValueError, match="h must be float32 or float64, got dtype int32"):
        C.gramian_update(h.astype(np.int32), J, *state(), 0)
    with pytest.raises(ValueError, match=r"J: size 2 on axis 0, expected 3"):
        C.gramian_update(h, J[:2], *state(), 0)
    with pytest.raises(ValueError, match=r"J: size 5 on axis 2, expected 4"):
        C.gramian_update(h, np.zeros((3, 1, 5)), *state(), 0)
    with pytest.raises(ValueError, match=r"h must have shape \(n, D\)"):
        C.gramian_update(h[0], J, *state(), 0)
    mean, m2, jj = state()
    with pytest.raises(ValueError, match=r"mean \(accumulator state\) must be float64"):
        C.gramian_update(h, J, mean.astype(np.float32), m2, jj, 0)
    with pytest.raises(ValueError, match=r"m2 \(accumulator state\) must have shape \(D, D\) with D = 4"):
        C.gramian_update(h, J, mean, m2[:3], jj, 0)
    with pytest.raises(ValueError, match=r"jj \(accumulator state\) must be C-contiguous"):
        C.gramian_update(h, J, mean, m2, np.zeros((D, 2 * D))[:, ::2], 0)
    with pytest.raises(ValueError, match="n_prev must be >= 0"):
        C.gramian_update(h, J, mean, m2, jj, -1)
    with pytest.raises(ValueError, match="kernel must be auto, portable, avx2 or avx512"):
        C.gramian_update(h, J, mean, m2, jj, 0, "sse9")


def test_wtc_kernels_reference_selects_torch(monkeypatch):
    monkeypatch.setenv("WTC_KERNELS", "reference")
    assert GramianAccumulator(3).backend == "reference"
    monkeypatch.delenv("WTC_KERNELS")
    assert GramianAccumulator(3).backend == ("native" if C is not None else "reference")


def balanced_pair(gen, D, sigma):
    """Cov = T diag(sigma) T^T, Obs = T^-T diag(sigma) T^-1: Cov Obs = T diag(sigma^2) T^-1, so the
    balanced singular values are sigma and the top-r core is span(T[:, :r]) (sigma descending)."""
    Q1 = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64)).Q
    Q2 = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64)).Q
    d = torch.linspace(0.5, 2.0, D, dtype=torch.float64)
    T = Q1 @ torch.diag(d) @ Q2.T
    Ti = torch.linalg.inv(T)
    return T @ torch.diag(sigma) @ T.T, Ti.T @ torch.diag(sigma) @ Ti, T


def test_randomized_balanced_svd_recovers_the_top_subspace(gen):
    D, r = 400, 5
    tail = 1e-2 * torch.rand(D - r, generator=gen, dtype=torch.float64).sort(descending=True).values
    sigma = torch.cat([torch.tensor([10.0, 8.0, 6.0, 5.0, 4.0], dtype=torch.float64), tail])
    cov, obs, T = balanced_pair(gen, D, sigma)
    basis_x, s_x = balanced_svd(cov, obs)
    basis_r, s_r = balanced_svd(cov, obs, rank=r, method="randomized", oversample=10, power_iters=2)
    assert basis_r.shape == (D, r) and s_r.shape == (r,)
    torch.testing.assert_close(basis_r.T @ basis_r, torch.eye(r, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(s_r, s_x[:r], rtol=1e-8, atol=0)
    torch.testing.assert_close(s_r, sigma[:r], rtol=1e-8, atol=0)
    truth = torch.linalg.qr(T[:, :r]).Q
    for k in range(1, r + 1):                                    # every prefix, as orth_prefixes promises
        assert projector_overlap(basis_r[:, :k], basis_x[:, :k]) >= 1 - 1e-8
    assert projector_overlap(basis_r, truth) >= 1 - 1e-8
    # the exact method truncated to the same rank, and the energy denominator without factorising
    b_t, s_t = balanced_svd(cov, obs, rank=r)
    torch.testing.assert_close(s_t, s_x[:r], rtol=0, atol=0)
    assert b_t.shape == (D, r) and projector_overlap(b_t, basis_r) >= 1 - 1e-8
    total = balanced_energy(cov, obs)
    assert total == pytest.approx(float((s_x ** 2).sum()), rel=1e-10)
    assert rank_for_energy(s_r, 0.5, total=total) == rank_for_energy(s_x, 0.5)


@pytest.mark.parametrize("case", ["rank-2 Obs", "N < D"])
def test_randomized_balanced_svd_on_singular_gramians(gen, case):
    """Obs of rank 2 (a readout of two directions): both methods give the same 2 directions.
    N < D (singular Cov): the same top-r core and singular values."""
    D = 300
    n = 2000 if case == "rank-2 Obs" else 120
    H = torch.randn(n, D, generator=gen, dtype=torch.float64) * torch.linspace(0.2, 3, D, dtype=torch.float64)
    if case == "rank-2 Obs":
        W = torch.randn(2, D, generator=gen, dtype=torch.float64)
        J = W.expand(n, 2, D)
    else:
        W = torch.randn(4, D, generator=gen, dtype=torch.float64) * torch.tensor([[4.0], [3.0], [2.0], [1.0]], dtype=torch.float64)
        J = torch.randn(n, 4, generator=gen, dtype=torch.float64)[:, :, None] * W + 1e-3 * torch.randn(n, 4, D, generator=gen, dtype=torch.float64)
    acc = GramianAccumulator(D)
    acc.add(H, J)
    cov, obs = acc.covariance(), acc.observability()
    bx, sx = balanced_svd(cov, obs)
    r = 6 if case == "rank-2 Obs" else 4
    br, sr = balanced_svd(cov, obs, rank=r, method="randomized")
    if case == "rank-2 Obs":
        assert len(sx) == 2 and len(sr) == 2
    torch.testing.assert_close(sr, sx[:len(sr)], rtol=1e-8, atol=0)
    assert projector_overlap(br, bx[:, :br.shape[1]]) >= 1 - 1e-8


def test_balanced_svd_arguments():
    A = torch.eye(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="needs rank"):
        balanced_svd(A, A, method="randomized")
    with pytest.raises(ValueError, match="method must be one of"):
        balanced_svd(A, A, method="lanczos")
    with pytest.raises(ValueError, match="square and of equal shape"):
        balanced_svd(A, torch.eye(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN"):
        balanced_svd(A * float("nan"), A)
