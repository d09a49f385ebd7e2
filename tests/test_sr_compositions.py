"""wtc.sr: nonlinearities around a product or a sum with a constant (issue 17 item 9)."""
from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from wtc import sr

rng = np.random.default_rng(0)
A = rng.uniform(0, 3, (1000, 2))

CASES = [
    ("log(1 + a*b)", lambda a, b: np.log(1 + a * b)),
    ("a/(1 + a*b)", lambda a, b: a / (1 + a * b)),
    ("a*sin(a + b)", lambda a, b: a * np.sin(a + b)),
    ("b*sqrt(1 + a**2)", lambda a, b: b * np.sqrt(1 + a**2)),
]


@pytest.mark.parametrize("truth,f", CASES, ids=[c[0] for c in CASES])
def test_composition_found(truth, f):
    y = f(*A.T)
    r = sr.fit(A, y, names=("a", "b"))
    assert r.exact, (truth, str(r))
    a, b = sp.symbols("a b", positive=True)   # the data have a, b > 0: Abs(b) == b there
    got = r.expr.subs({sp.Symbol("a"): a, sp.Symbol("b"): b})
    want = sp.sympify(truth, locals={"a": a, "b": b})
    assert sp.simplify(got - want) == 0, (truth, r.equation)
