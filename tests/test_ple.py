import numpy as np
import pytest
import torch

from wtc.dt.ple import ple, ple_uniform


def explicit_ple(x: float, bins) -> list[float]:
    """Gorishniy et al. 2022, component by component, in float64."""
    n = len(bins) - 1
    out = []
    for t in range(n):
        c = (x - bins[t]) / (bins[t + 1] - bins[t])
        if t > 0:
            c = max(c, 0.0)
        if t < n - 1:
            c = min(c, 1.0)
        out.append(c)
    return out


def random_bins(rng, n):
    return np.sort(rng.uniform(-3, 3, n + 1)) + np.arange(n + 1) * 1e-3


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_ple_matches_formula(rng, n):
    bins = random_bins(rng, n)
    # inside, on the edges, and outside on both sides (first not floored, last not capped)
    x = np.concatenate([rng.uniform(-6, 6, 200), bins, [bins[0] - 2.5, bins[-1] + 4.0]])
    want = np.array([explicit_ple(v, bins) for v in x])
    got = ple(torch.tensor(x), torch.tensor(bins)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if n > 1:  # inside bin t the code is [1, .., 1, frac, 0, .., 0]
        inside = (x > bins[0]) & (x < bins[-1])
        row = got[inside]
        assert np.all((row >= 0) & (row <= 1))
        assert np.all(np.diff(row, axis=1) <= 0)
    assert got[-2, 0] < 0 and got[-1, -1] > 1


@pytest.mark.parametrize("n", [1, 3, 8, 16])
def test_ple_uniform_equals_ple_on_unit_bins(rng, n):
    z = torch.tensor(rng.uniform(-0.5, 1.5, (7, 11)))
    want = ple(z, torch.linspace(0, 1, n + 1, dtype=torch.float64))
    torch.testing.assert_close(ple_uniform(z, n), want, rtol=1e-12, atol=1e-12)


def test_ple_gradient_is_piecewise_constant():
    bins = torch.tensor([0.0, 1.0, 3.0])
    x = torch.tensor([0.5, 2.0, -1.0, 5.0], requires_grad=True)
    ple(x, bins).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 0.5, 1.0, 0.5])
