"""ACE: balanced SVD against its definition, a planted core with a decoy, operators, CCA/overlap."""
import math
import os

import numpy as np
import pytest
import torch
from torch import nn

from wtc.ace import (GramianAccumulator, balanced_svd, cca, compare, extract_core, principal_angles,
                     projector_overlap, sequential_operator, shift_operator, validate)
from wtc.ace.balanced import orth_prefixes
from wtc.ace.core import patched_accuracy


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


def test_balanced_svd_equals_the_svd_of_h_jt(gen):
    N, K, D = 300, 3, 7
    H = torch.randn(N, D, generator=gen, dtype=torch.float64) @ torch.randn(D, D, generator=gen, dtype=torch.float64)
    J = torch.randn(N, K, D, generator=gen, dtype=torch.float64)
    acc = GramianAccumulator(D)
    for part in range(0, N, 64):                                   # streamed in chunks
        acc.add(H[part:part + 64], J[part:part + 64])
    basis, s = balanced_svd(acc.covariance(), acc.observability())
    Hc = H - H.mean(0)
    M = Hc @ J.reshape(-1, D).T / math.sqrt((N - 1) * N)            # Lc^T Lo with the data factors
    U, s_def, _ = torch.linalg.svd(M, full_matrices=False)
    torch.testing.assert_close(s, s_def[: len(s)], rtol=1e-8, atol=1e-10)
    for r in (1, 3, D):
        Q_def = orth_prefixes(Hc.T @ U[:, :r])
        assert projector_overlap(basis[:, :r], Q_def) == pytest.approx(1.0, abs=1e-8)


def test_streaming_gramians_match_the_batch_formulas(gen):
    H = torch.randn(50, 4, generator=gen, dtype=torch.float64)
    J = torch.randn(50, 2, 4, generator=gen, dtype=torch.float64)
    acc = GramianAccumulator(4)
    acc.add(H[:17], J[:17])
    acc.add(H[17:], J[17:])
    torch.testing.assert_close(acc.covariance(), torch.cov(H.T), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(acc.observability(), torch.einsum("nki,nkj->ij", J, J) / 50, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"\(n, 4\)"):
        acc.add(H[:, :3], J)
    with pytest.raises(ValueError, match="NaN"):
        acc.add(H[:2] * float("nan"), J[:2])


def decorrelated(gen, N, basis, scales):
    """Samples whose coordinates along the columns of `basis` have exactly zero sample covariance
    between the first two (the planted plane) and the rest. The core is orth(Cov P): with sampling
    noise in that covariance the plane would tilt toward high-variance directions by O(1/sqrt(N))."""
    A = torch.randn(N, basis.shape[1], generator=gen, dtype=torch.float64) * torch.tensor(scales, dtype=torch.float64)
    A = A - A.mean(0)
    plane, rest = A[:, :2], A[:, 2:]
    rest = rest - plane @ torch.linalg.lstsq(plane, rest).solution
    return torch.cat([plane, rest], 1) @ basis.T


class Planted(nn.Module):
    """Output depends on h only through a 2-D subspace P; inputs carry a large decoy direction."""

    def __init__(self, P, K=4):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Identity()
        self.P = P
        self.head = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, K)).double()

    def forward(self, x):
        h = self.layer(x)
        return self.head(h @ self.P)


def test_planted_core_is_found_and_the_decoy_is_excluded(gen):
    D = 8
    basis = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]
    P, decoy = basis[:, :2], basis[:, 2]
    model = Planted(P)
    x = decorrelated(gen, 4000, basis, [1.0, 1.0, 30.0, 1.0, 1.0, 1.0, 1.0, 1.0])     # decoy: 30x the spread
    labels = model(x).argmax(-1)
    core = extract_core(model, x, "layer", position=None, chunk=1000)
    assert core.rank == 2
    assert projector_overlap(core.Q, P) == pytest.approx(1.0, abs=1e-8)
    assert float(decoy @ core.projector() @ decoy) < 1e-10          # the high-variance decoy is not in it
    v = validate(core, model, x, labels)
    assert v["keep_acc"] == v["baseline_acc"] == 1.0
    assert v["remove_acc"] <= 2 * v["chance"]
    assert v["minimal_sufficient_rank"] == 2 and v["minimal_necessary_rank"] <= 2
    with pytest.raises(KeyError, match="no module named 'nope'"):
        extract_core(model, x, "nope", position=None)


def test_operator_identification_recovers_a_linear_system(gen):
    theta, rho = 2 * math.pi / 7, 0.9
    A = rho * torch.tensor([[math.cos(theta), math.sin(theta)], [-math.sin(theta), math.cos(theta)]], dtype=torch.float64)
    z0 = torch.randn(20, 2, generator=gen, dtype=torch.float64)
    Z = torch.stack([z0 @ torch.linalg.matrix_power(A, t) for t in range(10)], 1)      # (B, T, 2)
    fit = sequential_operator(Z)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-10)
    assert sorted(fit["radii"]) == pytest.approx([rho, rho], abs=1e-10)
    assert sorted(abs(a) for a in fit["angles"]) == pytest.approx([theta, theta], abs=1e-10)
    p = 7                                                          # class means on a circle: shift by one class
    reps = torch.stack([torch.tensor([math.cos(2 * math.pi * 3 * c / p), math.sin(2 * math.pi * 3 * c / p)])
                        for c in range(p)]).double()
    shift = shift_operator(reps)
    assert shift["residual"] < 1e-12 and shift["frequency_bins"] == [3, 3]
    assert shift["radii"] == pytest.approx([1.0, 1.0], abs=1e-12)
    with pytest.raises(ValueError, match="r >= p - 1"):      # exact for any class means: meaningless
        shift_operator(torch.randn(p, p - 1, dtype=torch.float64))


def test_overlap_angles_and_cca_on_hand_computed_cases(gen):
    e = torch.eye(4, dtype=torch.float64)
    assert projector_overlap(e[:, :2], e[:, :2]) == pytest.approx(1.0)
    assert projector_overlap(e[:, :2], e[:, 2:]) == pytest.approx(0.0)
    assert projector_overlap(e[:, :2], e[:, 1:3]) == pytest.approx(0.5)       # one shared of two
    tilt = torch.stack([e[:, 0], (e[:, 1] + e[:, 2]) / math.sqrt(2)], 1)
    torch.testing.assert_close(principal_angles(e[:, :2], tilt), torch.tensor([0.0, math.pi / 4], dtype=torch.float64))
    X = torch.randn(500, 3, generator=gen, dtype=torch.float64)
    R = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))[0]
    torch.testing.assert_close(cca(X, X @ R + 5.0), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-10)
    Y = torch.cat([X[:, :1], torch.randn(500, 2, generator=gen, dtype=torch.float64)], 1)
    rho = cca(X, Y)
    assert rho[0] == pytest.approx(1.0, abs=1e-10) and rho[1] < 0.3


def test_compare_cores_of_two_seeds(gen):
    """Two planted models computing the same function in rotated coordinates: near-orthogonal
    cores (low overlap) whose core coordinates are perfectly correlated (CCA 1)."""
    D = 6
    basis = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]
    P1, P2 = basis[:, :2], basis[:, 2:4]
    x = decorrelated(gen, 1000, basis, [1.0] * D)
    m1, m2 = Planted(P1), Planted(P2)
    x2 = x @ (P1 @ P2.T + P2 @ P1.T + basis[:, 4:] @ basis[:, 4:].T)   # swap the two planes
    c1 = extract_core(m1, x, "layer", position=None)
    c2 = extract_core(m2, x2, "layer", position=None)
    out = compare([c1, c2], activations=[x, x2], top=2)
    assert out["overlap"][0][1] < 1e-8 and out["cca"][0][1] == pytest.approx(1.0, abs=1e-8)


def test_jacobians_of_a_sequence_model_match_jacrev():
    from wtc.ace.core import activations_and_jacobians
    from wtc.models import Transformer, TransformerConfig
    cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=5, n_ctx=6)
    model = Transformer(cfg, seed=0).double()
    tokens = torch.randint(0, 5, (4, 6), generator=torch.Generator().manual_seed(0))
    H, J = activations_and_jacobians(model, tokens, "blocks.0.hook_resid_post", lambda out: out[:, -1], position=-1)
    assert H.shape == (4, 8) and J.shape == (4, 5, 8)
    _, cache = model.run_with_cache(tokens)
    resid = cache["blocks.0.hook_resid_post"]
    for b in range(4):
        def f(last):
            r = resid[b:b + 1].clone()
            r[0, -1] = last
            return model.logits_from(r, 1)[0, -1]
        torch.testing.assert_close(J[b], torch.func.jacrev(f)(resid[b, -1]), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(H[b], resid[b, -1])


@pytest.mark.slow
def test_markov_study_meets_the_expected_figures(tmp_path):
    """wtc study markov --quick: rank-3 core, keep = baseline, remove -> chance, seeds in
    near-orthogonal subspaces that compute the same thing, the chain's eigenvalues."""
    import json
    from wtc.cli import main
    assert main(["study", "markov", "--quick", "--quiet", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["rank"] == [3, 3, 3]
    assert all(abs(k - b) <= 0.005 for k, b in zip(s["keep_acc"], s["baseline_acc"]))
    assert all(r <= 2 * 0.25 for r in s["remove_acc"]) and all(b >= 0.74 for b in s["baseline_acc"])
    off = [s["overlap"][i][j] for i in range(3) for j in range(3) if i != j]
    cca = [s["cca"][i][j] for i in range(3) for j in range(3) if i != j]
    assert max(off) <= 0.1 and min(cca) >= 0.9
    assert max(s["eigenvalue_error"]) <= 0.05
    assert (tmp_path / "markov.png").exists()


def test_oblique_projector_ignores_a_high_variance_decoy_the_orthogonal_one_lets_through():
    """A planted rank-1 core (signal z along a) beside a high-variance decoy d along b, with b not
    orthogonal to a but invisible to the readout (w . b = 0). Keeping only the core with the
    orthogonal projector carries d (a . b) into the readout; the oblique projector, whose null
    space holds the unobservable b, keeps accuracy at baseline."""
    from torch import nn
    g = torch.Generator().manual_seed(0)
    n, D = 4000, 6
    a = torch.randn(D, generator=g, dtype=torch.float64)
    w = torch.randn(D, generator=g, dtype=torch.float64)
    b = torch.randn(D, generator=g, dtype=torch.float64)
    b -= (b @ w) / (w @ w) * w                                   # unobservable: w . b = 0
    b = b / b.norm() * a.norm()
    assert abs(float(b @ w)) < 1e-12 and abs(float(a @ b)) > 0.1 * float(a.norm() * b.norm())

    class Planted(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(2, D, bias=False, dtype=torch.float64)
            self.head = nn.Linear(D, 2, bias=False, dtype=torch.float64)
            with torch.no_grad():
                self.enc.weight.copy_(torch.stack([a, b], 1))
                self.head.weight.copy_(torch.stack([-w, w]) * torch.sign(a @ w))   # class 1 iff z > 0

        def forward(self, x):
            return self.head(self.enc(x))

    model = Planted()
    labels = torch.randint(0, 2, (n,), generator=g)
    z = (2.0 * labels - 1) * (0.5 + torch.rand(n, generator=g, dtype=torch.float64))
    d = 10.0 * torch.randn(n, generator=g, dtype=torch.float64)            # 10x the signal's scale
    x = torch.stack([z, d], 1)
    core = extract_core(model, x, "enc", readout=lambda out: out, position=None)
    assert core.rank == 1
    ortho = validate(core, model, x, labels, readout=lambda out: out)
    oblique = validate(core, model, x, labels, readout=lambda out: out, projector="oblique")
    assert ortho["baseline_acc"] == oblique["baseline_acc"] == 1.0
    assert oblique["keep_acc"] == 1.0 and oblique["remove_acc"] <= 0.55 and oblique["flip_acc"] == 0.0
    assert ortho["keep_acc"] < 0.8, ortho                        # the decoy leaks through Q Q^T
    P = core.projector(kind="oblique")
    torch.testing.assert_close(P @ P, P)                          # a projector, range = the core
    torch.testing.assert_close(P @ b, torch.zeros(D, dtype=torch.float64), atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="orthogonal' or 'oblique"):
        core.projector(kind="diagonal")


def test_necessary_rank_is_meaningful_for_two_classes(gen):
    """With 2 classes 2 x chance is 1.0, which every removal passes (the old rule said rank 0): the
    necessary rank is the first whose removal brings accuracy down to near chance, chance being
    what the majority answer scores on these (unbalanced) labels."""
    D = 8
    basis = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]
    P = basis[:, :2]
    model = Planted(P, K=2)
    x = decorrelated(gen, 4000, basis, [1.0, 1.0, 30.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    labels = model(x).argmax(-1)
    core = extract_core(model, x, "layer", position=None, chunk=1000)
    v = validate(core, model, x, labels)
    share = float(torch.bincount(labels).max()) / len(labels)
    assert v["baseline_acc"] == 1.0 and v["chance"] == pytest.approx(share) and share > 0.5
    necessary = v["minimal_necessary_rank"]
    assert necessary >= 1                                            # removing nothing is not "necessary"
    assert patched_accuracy(model, x, labels, core, "remove", necessary) <= v["chance"] + 0.1 * (1 - v["chance"])
    assert patched_accuracy(model, x, labels, core, "remove", necessary - 1) > v["chance"] + 0.1 * (1 - v["chance"])
