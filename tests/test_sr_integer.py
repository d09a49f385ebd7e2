"""wtc.sr on integer data: modulus, floor division, comparisons, thresholds, chained min/max and the
exact-table pass, enabled by the data (integer inputs and targets), printed as plain Python."""
from __future__ import annotations

import ast
import itertools
import math

import numpy as np
import pytest
import sympy as sp

from wtc import sr
from wtc.sr.expr import FloorDiv, Ge, Eq

X100 = np.arange(100.0)


def _grid(k, lo, hi):
    return np.array(list(itertools.product(range(lo, hi + 1), repeat=k)), dtype=float)


def _python_values(expr, names, X):
    """Evaluate the formula as the Python source wtc's programs are built from (pycode)."""
    from sympy.printing.pycode import pycode
    code = pycode(expr, fully_qualified_modules=True, strict=True)
    tree = ast.parse(code, mode="eval")          # plain Python
    fn = compile(tree, "<formula>", "eval")
    cols = X if X.ndim == 2 else X[:, None]
    return np.array([float(eval(fn, {"math": math}, dict(zip(names, map(float, row))))) for row in cols])


def _holds_on(expr, names, X, truth):
    f = sp.lambdify([sp.Symbol(n) for n in names], expr, modules="numpy")
    cols = X if X.ndim == 2 else X[:, None]
    got = np.broadcast_to(np.asarray(f(*cols.T), dtype=float), (len(cols),))
    return np.array_equal(got, truth(*cols.T).astype(float))


CASES = [
    # label, X, truth, names, what the equation must read as
    ("even detector", X100, lambda x: 1 - x % 2, ("x",), ("%",)),
    ("floor division", X100, lambda x: np.floor(x / 3), ("x",), ("x // 3",)),
    ("modulus", X100, lambda x: x % 3, ("x",), ("x % 3",)),
    ("threshold", X100, lambda x: (x >= 50).astype(float), ("x",), ("(x >= 50)",)),
    ("comparison", _grid(2, 0, 9), lambda a, b: (a >= b).astype(float), ("a", "b"), ("(a >= b)",)),
    ("equality", _grid(2, 0, 9), lambda a, b: (a == b).astype(float), ("a", "b"), ("(a == b)",)),
    ("sum mod 3", _grid(2, 0, 9), lambda a, b: (a + b) % 3, ("a", "b"), ("(a + b) % 3",)),
    ("majority", np.repeat(_grid(3, 0, 1), 10, 0), lambda a, b, c: (a + b + c >= 2).astype(float),
     ("a", "b", "c"), ("(a + b + c >= 2)",)),
    ("chained max/min", _grid(3, 0, 6), lambda a, b, c: np.maximum(a, np.minimum(b, c)), ("a", "b", "c"),
     ("Max", "Min")),
    ("scaled staircase", X100, lambda x: 0.5 * np.floor(x / 3), ("x",), ("//",)),
    ("band", X100, lambda x: ((x >= 20) & (x < 70)).astype(float), ("x",), ("(x >= 20)", "(x >= 70)")),
    ("sign", X100, lambda x: np.sign(x - 50), ("x",), ("(x >= 50)",)),
]


@pytest.mark.parametrize("label,X,truth,names,reads", CASES, ids=[c[0] for c in CASES])
def test_integer_formulas_read_as_such(label, X, truth, names, reads):
    cols = X if X.ndim == 2 else X[:, None]
    y = truth(*cols.T).astype(float)
    f = sr.fit(X, y, names=names)
    assert f.exact, (label, str(f))
    for r in reads:
        assert r in f.equation, (label, f.equation)
    assert not f.expr.has(sp.sin, sp.cos, sp.tanh, sp.exp), (label, f.equation)
    np.testing.assert_array_equal(f.predict(X), y)
    # plain Python (what extraction emits) gives the same values
    np.testing.assert_array_equal(_python_values(f.expr, names, X), y)
    # and the reading is the algorithm, not a fit of the sampled range: it holds on a wider grid
    wide = _grid(len(names), -30, 130) if len(names) == 1 else _grid(len(names), -3, 12)
    assert _holds_on(f.expr, names, wide, truth), (label, f.equation)


def test_even_detector_is_not_a_cosine():
    """Issue 17: an even-number detector on 0..99 came out as abs(cos(11/7*x))."""
    f = sr.fit(X100, 1 - X100 % 2)
    assert f.exact and f.expr.has(sp.Mod) and f.complexity <= 6, str(f)


def test_exact_table_pass_small_table():
    """27 cells: (a + 2b + c) % 3 is beyond the general library's depth but exact on the table."""
    X = _grid(3, 0, 2)
    y = (X[:, 0] + 2 * X[:, 1] + X[:, 2]) % 3
    f = sr.fit(np.repeat(X, 4, 0), np.repeat(y, 4), names=("a", "b", "c"))
    assert f.exact and f.expr.has(sp.Mod), str(f)
    np.testing.assert_array_equal(f.predict(X), y)


def test_integer_operators_follow_the_data_not_the_names():
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 10, 500)   # real inputs: no integer operators
    f = sr.fit(x, 2 * x + 1, names=("parity",))
    assert f.exact and "mod" not in f.operators and not f.expr.has(sp.Mod, FloorDiv, Ge, Eq)
    f = sr.fit(X100, X100 % 4, names=("speed",))   # integer data under any name
    assert f.exact and f.equation == "speed % 4"


def test_network_like_integer_output_with_tolerance():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 30, 2000).astype(float)
    y = x % 3 + 0.002 * np.sin(x)          # a sub-MLP's smooth error around the integers
    f = sr.fit(x, y, tol=0.01)
    assert f.exact and f.equation == "x % 3", str(f)


def test_integer_operators_by_name():
    x = np.arange(1.0, 60.0)
    f = sr.fit(x, x // 7, operators=["+", "-", "//"])
    assert f.exact and f.equation == "x // 7"
    with pytest.raises(ValueError, match="unknown operator"):
        sr.fit(x, x, operators=["modulo"])


def test_sympy_of_integer_operators_round_trips():
    a, b = sp.symbols("a b")
    assert str(FloorDiv(a + 1, 3) * 2) == "2*(a + 1) // 3" or str(FloorDiv(a + 1, 3) * 2) == "2*((a + 1) // 3)"
    assert FloorDiv(7, 2) == 3 and FloorDiv(-7, 2) == -4
    assert Ge(3, 2) == 1 and Ge(2, 3) == 0 and Eq(2, 2) == 1
    assert str(Ge(a + b, 2)) == "(a + b >= 2)"


def test_extraction_renders_integer_formulas_as_plain_python():
    """wtc.extraction builds program source from sr formulas (expression_ast): the new operators
    must pass its AST whitelist and compute the same values as plain Python."""
    from wtc.extraction.program import expression_ast
    X = _grid(2, 0, 9)
    for y in ((X[:, 0] + X[:, 1]) % 3, X[:, 0] // 4, (X[:, 0] >= X[:, 1]).astype(float),
              (X[:, 0] == X[:, 1]).astype(float)):
        f = sr.fit(X, y, names=("u", "v"))
        assert f.exact, str(f)
        node = expression_ast(f.expr, {"u", "v"})
        code = compile(ast.fix_missing_locations(ast.Expression(body=node)), "<program>", "eval")
        got = [eval(code, {"math": math}, {"u": list(X[:, 0]), "v": list(X[:, 1]), "t": t})
               for t in range(len(X))]
        np.testing.assert_array_equal(np.array(got, dtype=float), y)


def test_bits_keep_the_polynomial_unless_an_integer_reading_is_far_shorter():
    B = np.repeat(_grid(3, 0, 1), 10, 0)
    a, b, c = B.T
    xor = sr.fit(B[:, :2], a + b - 2 * a * b, names=("a", "b"))
    assert xor.exact and xor.equation == "-2*a*b + a + b", xor.equation   # the paper's reading
    parity = sr.fit(B, (a + b + c) % 2, names=("a", "b", "c"))
    assert parity.exact and parity.complexity <= 7 and not parity.expr.is_polynomial(), parity.equation
    np.testing.assert_array_equal(parity.predict(B), (a + b + c) % 2)


@pytest.mark.parametrize("values, hi, want", [
    ((2, 3, 5, 7), 10, "(x in {2, 3, 5, 7})"),
    ((0, 1, 4, 9, 16, 25, 36, 49), 50, "(x in {0, 1, 4, 9, 16, 25, 36, 49})"),
])
def test_a_detector_of_a_few_values_reads_as_set_membership(values, hi, want):
    x = np.arange(float(hi))[:, None]
    y = np.isin(x[:, 0], values).astype(float)
    f = sr.fit(x, y, names=("x",))
    assert f.exact and f.equation == want and f.complexity == 2 + len(values)
    np.testing.assert_array_equal(f.predict(x), y)
    from sympy.printing.pycode import pycode
    ns = {}
    exec(f"def g(x):\n    return {pycode(f.expr)}\n", ns)          # the program text runs as Python
    assert [ns["g"](v) for v in range(hi)] == list(y.astype(int))


def test_a_rule_beats_a_long_set():
    """Even numbers on 0..99: fifty values, so the modulus is the reading."""
    x = np.arange(100.0)[:, None]
    f = sr.fit(x, 1 - x[:, 0] % 2, names=("x",))
    assert f.equation == "1 - (x % 2)"         # -(x % 2) alone would print -x % 2, which Python reads as (-x) % 2
    g = sr.fit(x, (x[:, 0] % 3 == 0).astype(float), names=("x",))
    assert g.equation == "(x % 3 == 0)"                # not 1 - x**2 % 3 (opposite columns kept apart)
