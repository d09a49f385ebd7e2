"""wtc.sr: exact recovery of planted formulas, noise, honest failures, bad input, estimator API."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wtc import sr
from wtc.sr import numbers

N = 1000


def _equivalent(expr: sp.Expr, truth: str, names) -> bool:
    syms = {n: sp.Symbol(n) for n in names}
    t = sp.sympify(truth, locals=syms, rational=True)  # 4.905 -> 981/200: compare exactly
    return sp.simplify(sp.nsimplify(expr, rational=True) - t) == 0


def _data(kind, k, f, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "bits":
        X = rng.integers(0, 2, (N, k)).astype(float)
    elif isinstance(kind, tuple) and kind[0] == "int":
        X = rng.integers(kind[1], kind[2] + 1, (N, k)).astype(float)
    else:
        X = rng.uniform(kind[0], kind[1], (N, k))
    y = f(*X.T)
    y = y + noise * np.sqrt(np.mean(y**2)) * rng.standard_normal(N)
    return X, y


PLANTED = [
    ("xor on bits", "bits", ("a", "b"), lambda a, b: a + b - 2 * a * b, "a + b - 2*a*b"),
    ("product on ints 0..9", ("int", 0, 9), ("a", "b"), lambda a, b: a * b, "a*b"),
    ("max", (-2, 2), ("a", "b"), np.maximum, "Max(a, b)"),
    ("min", (-2, 2), ("a", "b"), np.minimum, "Min(a, b)"),
    ("relu(a - b)", (-2, 2), ("a", "b"), lambda a, b: np.maximum(a - b, 0), "Max(a - b, 0)"),
    ("free fall", (0, 4), ("t",), lambda t: 100 - 4.905 * t**2, "100 - 4.905*t**2"),
    ("affine", (-3, 3), ("a", "b"), lambda a, b: 2 * a - 3 * b + 1, "2*a - 3*b + 1"),
    ("exp(-0.5 x)", (0, 4), ("x",), lambda x: np.exp(-0.5 * x), "exp(-x/2)"),
]


@pytest.mark.parametrize("label,kind,names,f,truth", PLANTED, ids=[p[0] for p in PLANTED])
def test_exact_recovery(label, kind, names, f, truth):
    X, y = _data(kind, len(names), f)
    r = sr.fit(X, y, names=names)
    assert r.exact, (label, str(r))
    assert _equivalent(r.expr, truth, names), (label, r.equation)
    assert r.rmse <= r.tolerance
    np.testing.assert_allclose(r.predict(X), y, atol=1e-9 * (1 + np.abs(y).max()))


NOISY = [p for p in PLANTED if p[0] in ("xor on bits", "product on ints 0..9", "relu(a - b)",
                                        "free fall", "affine", "exp(-0.5 x)")]


@pytest.mark.parametrize("label,kind,names,f,truth", NOISY, ids=[p[0] for p in NOISY])
def test_noisy_targets_still_exact(label, kind, names, f, truth):
    X, y = _data(kind, len(names), f, noise=1e-3, seed=1)
    r = sr.fit(X, y, names=names)
    assert r.exact, (label, str(r))
    assert _equivalent(r.expr, truth, names), (label, r.equation)


def test_constants_snap_to_simple_numbers():
    X, y = _data((0, 4), 2, lambda m, v: 0.5 * m * v**2 + 1 / 3)
    r = sr.fit(X, y, names=("m", "v"))
    assert r.exact and _equivalent(r.expr, "m*v**2/2 + 1/3", ("m", "v")), r.equation
    X, y = _data((-2, 2), 1, lambda x: np.sin(2 * x + 1))
    r = sr.fit(X, y, names=("x",))
    assert r.exact and _equivalent(r.expr, "sin(2*x + 1)", ("x",)), r.equation


def test_simplest_numbers():
    assert numbers.simplest_in(4.905 - 3e-4, 4.905 + 3e-4).text == "4.905"
    assert numbers.simplest_in(0.33332, 0.33334).sym == sp.Rational(1, 3)
    assert numbers.simplest_in(-0.51, -0.49).value == -0.5
    assert numbers.simplest_in(3.14159, 3.14160).sym == sp.pi
    assert numbers.simplest_in(-1e-3, 2e-3).value == 0
    assert numbers.rounded(0.318309886, 1e-4).text == "0.3183"


@settings(max_examples=200, deadline=None)
@given(st.fractions(min_value=-50, max_value=50, max_denominator=60),
       st.floats(min_value=1e-9, max_value=1e-2))
@example(frac=Fraction(1244, 25), width=0.009999999999999998)   # lo = 49.75 exactly: an end that is simple
@example(frac=Fraction(149, 50), width=0.005)   # lo * 40 rounds to 119.0 in float, though lo > 119 / 40
def test_stern_brocot_is_simplest(frac, width):
    lo, hi = float(frac) - width, float(frac) + width
    q = numbers.simplest_rational(lo, hi)
    assert q is not None and lo <= float(q) <= hi
    # no rational with a smaller denominator lies in the interval (exact arithmetic on the floats'
    # values: lo * d rounded in float can land on an n / d just below lo)
    exact_lo, exact_hi = Fraction(lo), Fraction(hi)
    for d in range(1, q.denominator):
        n = math.ceil(exact_lo * d)
        assert not (Fraction(n, d) <= exact_hi), (lo, hi, q, Fraction(n, d))


def test_honest_failure_on_pure_noise():
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (N, 2))
    r = sr.fit(X, rng.standard_normal(N))
    assert not r.exact
    assert "noise" in r.note


def test_honest_failure_outside_grammar():
    rng = np.random.default_rng(4)
    x = rng.uniform(0.2, 3, N)
    r = sr.fit(x, np.sin(1 / x) * np.exp(x), max_complexity=7)
    assert not r.exact
    assert r.rmse > r.tolerance and "tolerance" in r.note
    assert r.candidates and all(row.complexity <= 7 for row in r.candidates)


def test_network_like_smooth_error_with_user_tolerance():
    # a sub-MLP's output: the exact function plus a smooth relative error of ~2e-3
    X, y = _data(("int", 0, 9), 2, lambda a, b: a * b * (1 + 2e-3 * np.sin(a + 2 * b)))
    r = sr.fit(X, y, names=("a", "b"), tol=1e-2)
    assert r.exact and _equivalent(r.expr, "a*b", ("a", "b")), str(r)


def test_user_tolerance():
    X, y = _data((0, 3), 1, lambda x: x + 0.01 * x**2)
    assert _equivalent(sr.fit(X, y, tol=0.05).expr, "x", ("x",))  # loose: the simpler formula
    assert not _equivalent(sr.fit(X, y, tol=1e-6).expr, "x", ("x",))


@pytest.mark.parametrize("X,y,kw,match", [
    (np.array([[0.0, np.nan]] * 20), np.zeros(20), {}, "non-finite"),
    (np.zeros((20, 2)), np.full(20, np.inf), {}, "non-finite"),
    (np.zeros((20, 2)), np.zeros(19), {}, "disagree"),
    (np.zeros((5, 2)), np.zeros(5), {}, "too few"),
    (np.zeros((20, 11)), np.zeros(20), {}, "at most 10"),
    (np.zeros((20, 2, 2)), np.zeros(20), {}, "shape"),
    (np.zeros((20, 2)), np.zeros((20, 2)), {}, "shape"),
    (np.zeros((20, 2)), np.zeros(20), {"names": ("a",)}, "names"),
    (np.zeros((20, 2)), np.zeros(20), {"names": ("a", "a")}, "distinct"),
    (np.zeros((20, 1)), np.zeros(20), {"names": ("1x",)}, "identifier"),
    (np.zeros((20, 1)), np.zeros(20), {"operators": ["+", "frobnicate"]}, "unknown operator"),
    (np.zeros((20, 1)), np.zeros(20), {"tol": -1.0}, "tol"),
    (np.zeros((20, 1)), np.zeros(20), {"max_complexity": 0}, "max_complexity"),
])
def test_bad_input(X, y, kw, match):
    with pytest.raises(ValueError, match=match):
        sr.fit(X, y, **kw)


def test_estimator_api():
    X, y = _data((-2, 2), 2, lambda a, b: a * b + 1)
    m = sr.SymbolicRegressor(max_complexity=12, variable_names=["a", "b"])
    with pytest.raises(sr.NotFittedError):
        m.predict(X)
    assert m.fit(X, y) is m
    assert _equivalent(m.sympy(), "a*b + 1", ("a", "b"))
    np.testing.assert_allclose(m.predict(X), y, atol=1e-9)
    assert m.score(X, y) > 1 - 1e-12
    assert m.best_["exact"] and m.best_["complexity"] == 5 and m.best_["max_abs_err"] < 1e-9
    rows = m.equations_        # a DataFrame with pandas installed, else a list of dicts
    rows = rows if isinstance(rows, list) else rows.to_dict("records")
    assert rows and all({"complexity", "loss", "score", "equation", "sympy_format", "lambda_format", "passes"} <= set(r)
                        for r in rows)
    cs = [r["complexity"] for r in rows]
    assert cs == sorted(cs) and all(r["complexity"] <= 12 for r in rows)
    losses = [r["loss"] for r in rows]
    assert all(b < a for a, b in zip(losses, losses[1:]))  # a Pareto front: each row improves
    assert m.get_params()["max_complexity"] == 12
    assert m.set_params(tol=1e-3).tol == 1e-3


def test_fixed_operator_list():
    X, y = _data((1, 3), 2, lambda a, b: a / b)
    r = sr.fit(X, y, names=("a", "b"), operators=["+", "-", "*", "/"])
    assert r.exact and _equivalent(r.expr, "a/b", ("a", "b"))
    assert "sqrt" not in r.operators


def test_pysr_backend_is_lazy_and_explains_what_is_missing():
    import sys
    assert "pysr" not in sys.modules and "juliacall" not in sys.modules
    ok, missing = sr.pysr_available()
    if ok:
        pytest.skip("PySR and Julia are installed here")
    assert missing
    X, y = _data((0, 1), 1, lambda x: 2 * x)
    with pytest.raises(sr.BackendUnavailable, match="missing"):
        sr.SymbolicRegressor(backend="pysr").fit(X, y)
    assert "pysr" not in sys.modules
    with pytest.raises(ValueError, match="backend"):
        sr.SymbolicRegressor(backend="julia").fit(X, y)


def test_time_limit_is_respected_and_reported():
    rng = np.random.default_rng(5)
    X = rng.uniform(0.2, 3, (N, 3))
    y = np.sin(1 / X[:, 0]) * np.exp(X[:, 1]) + X[:, 2] ** 3
    r = sr.fit(X, y, time_limit=0.05)   # far below what this search needs: it must stop early
    assert r.timed_out and "time limit" in r.note
    assert not r.exact and r.candidates
