"""wtc.sr with many inputs: the sum, maximum and minimum of all of them are library terms (a
window's sum or maximum, a majority vote = a threshold of the sum), found exactly where the
enumeration alone never reaches them; with three inputs nothing changes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import sympy as sp

from wtc import sr
from wtc.sr.enumeration import enumerate_library


def names(k):
    return tuple(f"v{i}" for i in range(k))


def same(expr, want, k, X):
    f = sp.lambdify([sp.Symbol(n) for n in names(k)], expr, modules=["numpy"])
    return np.allclose(np.broadcast_to(f(*X.T), len(X)), want)


def test_a_majority_of_five_bits_is_a_threshold_of_their_sum():
    X = np.array(list(itertools.product([0, 1], repeat=5)), float)
    y = (X.sum(1) >= 3).astype(float)
    fit = sr.fit(X, y, names=names(5))
    assert fit.exact and same(fit.expr, y, 5, X)
    assert isinstance(fit.expr, sp.GreaterThan) or "3" in str(fit.expr), fit.equation


@pytest.mark.parametrize("k, reduce", [(5, np.max), (7, np.max), (6, np.min)])
def test_the_extremum_of_a_window_is_one_term(k, reduce):
    X = np.random.default_rng(k).integers(0, 100, (3000, k)).astype(float)
    y = reduce(X, axis=1)
    fit = sr.fit(X, y, names=names(k), tol=1e-6)      # as extraction calls it (a 6-D noise estimate calls
    #                                                   the minimum of six "noise" on its own)
    assert fit.exact and same(fit.expr, y, k, X), fit.equation
    assert fit.complexity == 2 * k - 1                # the chain itself, nothing else


def test_a_scaled_sum_of_six_reals():
    X = np.random.default_rng(1).uniform(-1, 1, (2000, 6))
    y = 0.25 * X.sum(1) + 1.5
    fit = sr.fit(X, y, names=names(6))
    assert fit.exact and same(fit.expr, y, 6, X), fit.equation


def test_chains_join_only_libraries_of_four_or_more_inputs():
    rng = np.random.default_rng(0)
    for k, want in ((3, 0), (4, 3)):
        probes = rng.uniform(0, 1, (40, k))
        lib = enumerate_library(probes, 30, ("add", "sub", "mul", "max", "min"), max_size=5, max_terms=100)
        assert len(lib.chains) == want
        for i in lib.chains:
            assert lib.sizes[i] == 2 * k - 1 and lib.trees[i][0] in ("add", "max", "min")
