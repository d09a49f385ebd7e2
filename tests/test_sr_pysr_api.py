"""SymbolicRegressor as a PySR user consumes it: DataFrame column names, sample_weight, the
equations table and its rows (sympy/latex/get_best by index), multi-output y, torch export."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import sympy as sp

from wtc import sr
from wtc.errors import SRError

try:
    import pandas as pd
except ImportError:          # the DataFrame tests skip; the rest runs (pandas is in the test extra)
    pd = None
needs_pandas = pytest.mark.skipif(pd is None, reason="pandas is not installed")

FAST = dict(time_limit=5.0)


def _same(expr, text: str) -> bool:
    """expr equals the formula written in text (over the symbols it names)."""
    return sp.simplify(expr - sp.sympify(text, locals={s.name: s for s in expr.free_symbols})) == 0


def _energy(n=120, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"mass": rng.uniform(1, 3, n), "vel": rng.uniform(-2, 2, n)})
    return df, df["mass"] * df["vel"] ** 2 / 2


# ------------------------------------------------------------------------------ column names
@needs_pandas
def test_dataframe_column_names_are_the_variables():
    df, y = _energy()
    m = sr.SymbolicRegressor(**FAST).fit(df, y)
    assert m.sympy().free_symbols == {sp.Symbol("mass"), sp.Symbol("vel")}
    assert _same(m.sympy(), "mass*vel**2/2") and "mass" in m.best_["equation"]
    assert m.feature_names_in_.dtype == object and list(m.feature_names_in_) == ["mass", "vel"]
    assert all(r.free_symbols <= {sp.Symbol("mass"), sp.Symbol("vel")} for r in m.equations_["sympy_format"])
    np.testing.assert_allclose(m.predict(df), y, rtol=1e-12)
    with pytest.raises(SRError, match="feature names should match"):
        m.predict(df[["vel", "mass"]])          # reordered columns would silently swap the inputs
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        np.testing.assert_allclose(m.predict(df.to_numpy()), y, rtol=1e-12)


@needs_pandas
def test_variable_names_override_the_columns_and_name_arrays():
    df, y = _energy()
    m = sr.SymbolicRegressor(**FAST).fit(df, y, variable_names=["m", "v"])   # PySR's fit argument
    assert _same(m.sympy(), "m*v**2/2")
    assert list(m.feature_names_in_) == ["mass", "vel"]    # what predict checks its input against
    m = sr.SymbolicRegressor(variable_names=["m", "v"], **FAST).fit(df.to_numpy(), y.to_numpy())
    assert _same(m.sympy(), "m*v**2/2") and list(m.feature_names_in_) == ["m", "v"]
    m = sr.SymbolicRegressor(**FAST).fit(df.to_numpy(), y.to_numpy())
    assert _same(m.sympy(), "x0*x1**2/2") and list(m.feature_names_in_) == ["x0", "x1"]
    with pytest.warns(UserWarning, match="fitted without feature names"):
        m.predict(df)


@needs_pandas
def test_a_column_name_that_cannot_be_a_variable_says_how_to_rename():
    df, y = _energy(n=20)
    with pytest.raises(SRError, match=r"'mass \(kg\)' is not a valid identifier.*variable_names="):
        sr.SymbolicRegressor(**FAST).fit(df.rename(columns={"mass": "mass (kg)"}), y)


# ------------------------------------------------------------------------------ sample_weight
def _contaminated(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, 2))
    y = X[:, 0] * X[:, 1] ** 2 / 2
    bad = np.arange(n) < n // 2
    y[bad] = 2 * np.sin(3 * X[bad, 0]) + X[bad, 1]      # half the rows follow another law
    return X, y, bad


def test_weights_that_zero_out_the_contaminated_half_find_the_law():
    X, y, bad = _contaminated()
    plain = sr.SymbolicRegressor(variable_names=["a", "b"], time_limit=2.0).fit(X, y)
    assert not plain.best_["exact"] and not _same(plain.sympy(), "a*b**2/2")
    for w in (np.where(bad, 0.0, 1.0), np.where(bad, 1e-6, 1.0)):   # left out, or nearly weightless
        m = sr.SymbolicRegressor(variable_names=["a", "b"], **FAST).fit(X, y, sample_weight=w)
        assert m.best_["exact"] and _same(m.sympy(), "a*b**2/2"), (w[0], m.best_)
    # PySR's name for the argument
    m = sr.SymbolicRegressor(variable_names=["a", "b"], **FAST).fit(X, y, weights=np.where(bad, 0.0, 1.0))
    assert _same(m.sympy(), "a*b**2/2")
    with pytest.raises(SRError, match="not both"):
        sr.SymbolicRegressor().fit(X, y, sample_weight=np.ones(len(y)), weights=np.ones(len(y)))


def test_weights_are_rows_left_out_repeated_or_all_alike():
    rng = np.random.default_rng(3)
    X = rng.uniform(0.5, 2, (60, 2))
    y = X[:, 0] / X[:, 1] + 1
    keep = rng.random(len(y)) < 0.6
    dropped = sr.fit(X, y + 5 * ~keep, sample_weight=keep.astype(float), **FAST)  # the others are off by 5
    removed = sr.fit(X[keep], y[keep], **FAST)
    assert (dropped.expr, dropped.loss, dropped.complexity) == (removed.expr, removed.loss, removed.complexity)
    assert dropped.exact and _same(dropped.expr, "x0/x1 + 1")
    w = rng.integers(1, 4, len(y)).astype(float)
    weighted = sr.fit(X, y, sample_weight=w, **FAST)
    repeated = sr.fit(np.repeat(X, w.astype(int), axis=0), np.repeat(y, w.astype(int)), **FAST)
    assert _same(weighted.expr, str(repeated.expr)) and weighted.exact and repeated.exact
    ones = sr.fit(X, y, sample_weight=np.full(len(y), 2.5), **FAST)
    plain = sr.fit(X, y, **FAST)
    assert (ones.expr, ones.loss, ones.complexity) == (plain.expr, plain.loss, plain.complexity)


def test_the_reported_loss_is_the_weighted_mean_squared_error():
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, (200, 1))
    y = 3 * X[:, 0] + rng.normal(0, 0.05, len(X))
    w = rng.uniform(0.2, 5.0, len(X))
    f = sr.fit(X, y, names=("x",), sample_weight=w, **FAST)
    r = y - f.predict(X)
    assert f.loss == pytest.approx(np.average(r**2, weights=w), rel=1e-9)
    assert f.loss != pytest.approx(np.mean(r**2), rel=1e-6)
    assert f.r2 == pytest.approx(1 - np.sum(w * r**2) / np.sum(w * (y - np.average(y, weights=w)) ** 2), rel=1e-9)


@pytest.mark.parametrize("weights, match", [
    (np.ones(5), r"sample_weight must have shape \(40,\)"),
    (np.ones((40, 2)), r"sample_weight must have shape \(40,\)"),
    (np.r_[-1.0, np.ones(39)], "must be non-negative, got -1 at row 0"),
    (np.r_[np.nan, np.ones(39)], "non-finite values"),
    (np.zeros(40), "zero everywhere"),
    (np.r_[np.ones(3), np.zeros(37)], "too few points of positive sample_weight"),
    (np.array(["a"] * 40), "sample_weight"),
])
def test_bad_weights_are_named(weights, match):
    X = np.linspace(0, 1, 40)[:, None]
    with pytest.raises(SRError, match=match):
        sr.SymbolicRegressor().fit(X, 2 * X[:, 0], sample_weight=weights)


# ------------------------------------------------------------------------------ rows of the table
@needs_pandas
def test_sympy_latex_and_get_best_by_row():
    rng = np.random.default_rng(2)
    t = rng.uniform(0, 4, 150)
    df = pd.DataFrame({"t": t})
    m = sr.SymbolicRegressor(**FAST).fit(df, 100 - 4.905 * t**2)
    table = m.equations_
    assert isinstance(table, pd.DataFrame)
    assert list(table.columns) == ["complexity", "loss", "score", "equation", "sympy_format", "lambda_format",
                                   "passes"]
    assert _same(m.sympy(), "100 - 4.905*t**2")
    for i in range(len(table)):
        assert m.sympy(i) == table["sympy_format"].iloc[i]
        np.testing.assert_allclose(m.predict(df, index=i), table["lambda_format"].iloc[i](df.to_numpy()))
        assert m.get_best(i)["equation"] == table["equation"].iloc[i]
    assert m.sympy(-1) == table["sympy_format"].iloc[-1]
    with pytest.raises(IndexError, match=f"row {len(table)} is past the equations table"):
        m.sympy(len(table))
    best = m.get_best()
    assert isinstance(best, pd.Series) and best["sympy_format"] == m.sympy() and best["passes"]
    assert best["complexity"] == m.best_["complexity"] and best["loss"] == m.best_["loss"]
    assert "4.905" in m.latex() and "t^{2}" in m.latex()
    assert "4.91" in m.latex(precision=3) and "4.905" not in m.latex(precision=3)
    with pytest.raises(SRError, match="precision"):
        m.latex(precision=0)


def test_without_pandas_the_table_is_a_list_of_dicts(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)       # `import pandas` now fails
    X = np.random.default_rng(0).uniform(-2, 2, (100, 2))
    m = sr.SymbolicRegressor(variable_names=["a", "b"], **FAST).fit(X, X[:, 0] * X[:, 1] + 1)
    assert isinstance(m.equations_, list) and isinstance(m.equations_[0], dict)
    assert set(m.equations_[0]) == {"complexity", "loss", "score", "equation", "sympy_format", "lambda_format",
                                    "passes"}
    best = m.get_best()
    assert isinstance(best, dict) and _same(best["sympy_format"], "a*b + 1")
    assert m.sympy(-1) == m.equations_[-1]["sympy_format"]
    np.testing.assert_allclose(m.predict(X, index=-1), m.equations_[-1]["lambda_format"](X))


@needs_pandas
def test_the_fitted_estimator_pickles_with_its_table():
    import pickle
    df, y = _energy(n=60)
    m = pickle.loads(pickle.dumps(sr.SymbolicRegressor(**FAST).fit(df, y)))
    np.testing.assert_allclose(m.predict(df, index=-1), m.equations_["lambda_format"].iloc[-1](df.to_numpy()))


# ------------------------------------------------------------------------------ several outputs
@needs_pandas
def test_multi_output_fits_one_search_per_column():
    rng = np.random.default_rng(4)
    df = pd.DataFrame({"a": rng.uniform(-2, 2, 120), "b": rng.uniform(-2, 2, 120)})
    Y = np.stack([df.a * df.b, df.a + 2], axis=1)
    m = sr.SymbolicRegressor(**FAST).fit(df, Y)
    assert m.nout_ == 2 and isinstance(m.equations_, list) and len(m.equations_) == 2
    assert all(isinstance(t, pd.DataFrame) for t in m.equations_)
    exprs = m.sympy()
    assert isinstance(exprs, list) and _same(exprs[0], "a*b") and _same(exprs[1], "a + 2")
    assert m.predict(df).shape == (120, 2)
    np.testing.assert_allclose(m.predict(df), Y, atol=1e-9)
    assert m.score(df, Y) > 1 - 1e-12
    assert isinstance(m.latex(), list) and isinstance(m.get_best(), list) and isinstance(m.best_, list)
    rows = [0, -1]
    assert m.sympy(rows) == [m.equations_[0]["sympy_format"].iloc[0], m.equations_[1]["sympy_format"].iloc[-1]]
    np.testing.assert_allclose(m.predict(df, index=rows)[:, 1], m.equations_[1]["lambda_format"].iloc[-1](df.to_numpy()))
    with pytest.raises(SRError, match="list of 2 row indices"):
        m.sympy(0)
    with pytest.raises(SRError, match="must list 2 row indices"):
        m.sympy([0])
    # one column is one output, as PySR reads it
    m1 = sr.SymbolicRegressor(**FAST).fit(df, Y[:, :1])
    assert m1.nout_ == 1 and m1.predict(df).shape == (120,) and _same(m1.sympy(), "a*b")


# ------------------------------------------------------------------------------ torch export
@needs_pandas
def test_pytorch_module_computes_predict():
    torch = pytest.importorskip("torch")
    df, y = _energy(n=80)
    m = sr.SymbolicRegressor(**FAST).fit(df, y)
    X = torch.tensor(df.to_numpy(), dtype=torch.float64)
    for index in [None, *range(len(m.equations_))]:
        module = m.pytorch(index)
        assert isinstance(module, torch.nn.Module)
        out = module(X)
        assert out.dtype == torch.float64 and out.shape == (80,)
        np.testing.assert_allclose(out.detach().numpy(), m.predict(df, index=index), rtol=1e-12, atol=1e-12)
    module = m.pytorch()
    out32 = module(X.float())
    assert out32.dtype == torch.float32
    np.testing.assert_allclose(out32.detach().numpy(), m.predict(df), rtol=1e-5)
    # the constants are parameters: a gradient reaches them
    module(X).sum().backward()
    assert module.constants.grad is not None and torch.all(torch.isfinite(module.constants.grad))
    with pytest.raises(SRError, match=r"shape \(n, 2\)"):
        module(X[:, :1])


def test_pytorch_covers_the_engines_operators():
    torch = pytest.importorskip("torch")
    from wtc.sr.equations import NumpyFormula
    from wtc.sr.expr import Eq, FloorDiv, Ge, In
    from wtc.sr.torch_export import to_torch
    a, b = sp.symbols("a b")
    exprs = [sp.Rational(3, 7) * a**3 - sp.sqrt(sp.Abs(b)) / 2, sp.exp(-a / 2) * sp.sin(2 * b + 1),
             sp.log(1 + a**2) + sp.cos(b) * sp.tanh(a), sp.Max(a - b, 0) + sp.Min(a, b, 1),
             sp.Mod(a, 3) + FloorDiv(b, 2) + Ge(a, b) - Eq(a, b), In(a, 2, 3, 5) + sp.pi * a ** sp.Rational(3, 2),
             1 / (1 + sp.Float(0.3) * a**2), sp.Integer(7)]
    rng = np.random.default_rng(0)
    X = np.c_[rng.integers(0, 7, 50), rng.integers(-4, 5, 50)].astype(np.float64)   # integers: % // == in
    for e in exprs:
        want = NumpyFormula(e, ("a", "b"))(X)
        got = to_torch(e, ("a", "b"))(torch.from_numpy(X)).detach().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=str(e))
    with pytest.raises(SRError, match="no torch form for gamma"):
        to_torch(sp.gamma(a), ("a", "b"))
