"""A sub-MLP read through a residue of its input (wtc.extraction.residues), moduli past 10 in the
SR (`wtc.sr.fit(moduli=...)`), Mod printed as Python reads it, and MIPS's Dithering read from the
model discover saved in session 35 (tests/models/Dithering): its level of the prefix sum is a
function of the sum and the sum modulo 15, and the program it gives is checked from its source
against the task's definition at twice and four times the length it was read at."""
import ast
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

import wtc
import wtc.sr as sr
from wtc.errors import SRError
from wtc.extraction import extract, verify
from wtc.extraction.formulas import formula
from wtc.extraction.program import expression_ast
from wtc.extraction.residues import residue_formula
from wtc.sr.expr import FloorDiv
from wtc.sr.pareto import equation_str
from wtc.tasks import mips

MODELS = Path(__file__).parent / "models"


def _dithering_columns(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 200, n).astype(float)
    x = rng.integers(0, 16, n).astype(float)
    return s, x


def test_sr_moduli_make_a_residue_past_ten_a_formula():
    s, x = _dithering_columns()
    y = (np.mod(s, 15) < x).astype(float)
    f = sr.fit(np.stack([s, x], 1), y, names=["s", "x"], moduli=(15,))
    assert f.exact and sp.Mod(sp.Symbol("s"), 15) in f.expr.atoms(sp.Mod), f
    np.testing.assert_array_equal(f.predict(np.stack([s, x], 1)), y)


@pytest.mark.parametrize("bad", [(1,), (2.5,), ("15",), 15, (10**7,), (True,), np.array(15)])
def test_sr_moduli_refuse_what_is_no_modulus(bad):
    s, x = _dithering_columns(200)
    with pytest.raises(SRError, match="moduli"):
        sr.fit(np.stack([s, x], 1), x, names=["s", "x"], moduli=bad)


@pytest.mark.parametrize("expr", ["-8/25*Mod(s, 15) + 1", "2*Mod(s + 3*Mod(x, 7), 2)", "x*Mod(s, 3) - Mod(s, 4)",
                                  "Mod(s, 7)**2", "1 - Mod(s, 15)", "Mod(x + Mod(s, 7), 2)", "Mod(x, 3) - Mod(s, 15)",
                                  "2**(-Mod(s, 3))", "x - 2*FloorDiv(s, 15)", "-3/10*FloorDiv(s, 15)",
                                  "x + FloorDiv(s, 3) - Mod(s, 4)"])
def test_mod_is_printed_as_python_computes_it(expr):
    """Both printers: the program's line and the equation shown, run as Python, give the formula's values."""
    e = sp.sympify(expr, locals={"FloorDiv": FloorDiv})
    s, x = _dithering_columns(500, seed=1)
    want = sp.lambdify([sp.Symbol("s"), sp.Symbol("x")], e, modules="numpy")(s, x)
    line = ast.unparse(expression_ast(e, {"s", "x"}))
    got_line = [eval(line, {"s": [a], "x": [b], "t": 0}) for a, b in zip(s, x)]   # noqa: S307 - our own text
    text = equation_str(e)
    got_text = [eval(text, {"s": a, "x": b}) for a, b in zip(s, x)]               # noqa: S307
    np.testing.assert_allclose(got_line, want, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(got_text, want, rtol=1e-6, atol=1e-6)


def test_a_level_of_a_prefix_sum_reads_through_its_residue():
    s, m = _dithering_columns()
    m = m / 16.0                                              # a second, unused, non-integer input
    y = -0.32 * np.mod(s, 15) + 0.02 * s + 1.4
    tol = 1e-3

    def read(X, y, names):
        return formula(X, y, names, tol, widen=(1.0,), moduli=(15,))

    found = residue_formula(np.stack([s, m], 1), y, ("s", "m"), (2, 3, 5, 15), tol, read, widen=(1.0,))
    assert found is not None
    expr, evidence = found
    assert sp.Mod(sp.Symbol("s"), 15) in expr.atoms(sp.Mod) and "modulo 15" in evidence, found
    values = sp.lambdify([sp.Symbol("s")], expr, modules="numpy")(s)
    np.testing.assert_allclose(values, y, atol=tol)
    # no period of the model's explains it: no reading
    assert residue_formula(np.stack([s, m], 1), y, ("s", "m"), (2, 3, 4, 5, 6), tol, read, widen=(1.0,)) is None


def test_dithering_reads_through_the_residue_of_the_prefix_sum():
    """Error diffusion by 15: floor(S_t / 15) - floor(S_(t-1) / 15). The model's level sub-MLP is
    -0.32 (S mod 15) + 0.02 S + ..., a sine of the sum alone before; a second sub-MLP the output
    weighs at a tenth fits no formula and is said to be read as its best one, because the whole
    program makes every one of the model's decisions with it."""
    task = mips.get("Dithering")
    program = extract(wtc.load(MODELS / "Dithering"), task)
    assert program.ok, program.failures
    level = sp.Mod(sp.Symbol("sum_x"), 15)
    residue = [ln for ln in program.lines if ln.expr is not None and level in ln.expr.atoms(sp.Mod)]
    assert residue, [str(ln.expr) for ln in program.lines]
    absorbed = [r for r in program.readings if r.kind == "mlp" and "read as this formula" in r.evidence]
    assert absorbed and all(r.ok for r in absorbed)                                       # said, not hidden
    v = verify(program, task, n=2000, seed=3)
    assert v.solved and v.holds_longer and v.holds_longest, v
    namespace: dict = {}
    exec(program.source, namespace)                       # as a user runs it: the source, in a fresh namespace
    x = np.random.default_rng(14).integers(0, 16, (200, 40))
    got = np.array([namespace["program"](s.tolist()) for s in x])
    # an integer task's program is judged by its rounded outputs (the linear readout is not snapped whole)
    np.testing.assert_array_equal(np.round(got), mips.dithering(x, 15))


def test_the_estimator_takes_moduli_too():
    s, x = _dithering_columns()
    y = (np.mod(s, 15) < x).astype(float)
    m = sr.SymbolicRegressor(moduli=(15,), time_limit=30).fit(np.stack([s, x], 1), y, variable_names=["s", "x"])
    assert m.best_["exact"] and "s % 15" in m.best_["equation"], m.best_
    assert m.get_params()["moduli"] == (15,)
    with pytest.raises(SRError, match="moduli"):
        sr.SymbolicRegressor(moduli=(0,)).fit(np.stack([s, x], 1), y)
    with pytest.raises(SRError, match="builtin"):
        sr.SymbolicRegressor(moduli=(15,), backend="pysr").fit(np.stack([s, x], 1), y)


def test_a_counter_mod_twelve_reads_with_the_models_period_as_modulus():
    """A count mod 12 of digits 0..3 declared with lambdas: the probe finds the period in 2.5 spans of
    the sums seen, discover gives the sub-MLPs that period, and the output regression may then say
    `% 12` (past the SR's default moduli 2..10). The model is discover's (session 38, seed 0)."""
    task = wtc.Task("count_mod12", lambda rng, n: rng.integers(0, 4, (n, 10)), lambda x: np.cumsum(x, 1) % 12,
                    seq_len=10, any_length=True)
    model = wtc.load(MODELS / "count_mod12")
    assert 12 in model.config.mlp_periods
    program = extract(model, task)
    assert program.ok, program.failures
    assert program.outputs[0] == sp.Mod(sp.Symbol("sum_x"), 12), program.outputs
    namespace: dict = {}
    exec(program.source, namespace)
    x = np.random.default_rng(15).integers(0, 4, (200, 40))
    got = np.array([namespace["program"](s.tolist()) for s in x])
    np.testing.assert_array_equal(got, np.cumsum(x, 1) % 12)


def test_moduli_the_search_cannot_use_are_said_so():
    s, x = _dithering_columns(400)
    f = sr.fit(np.stack([s * 100, x], 1), (np.mod(s * 100, 15) < x).astype(float), names=["s", "x"], moduli=(15,),
               time_limit=10)
    assert "moduli unused" in f.note and "rescaled" in f.note, f.note


def test_the_residue_reading_regresses_at_most_a_bounded_number_of_pairs():
    """A parity of s fits the tables of periods 2, 4 and 6 of s: a regression that never passes is
    run at most MAX_REGRESSIONS times, and nothing is read."""
    from wtc.extraction.residues import MAX_REGRESSIONS
    s, x = _dithering_columns()
    y = np.mod(s, 2) + 0.5 * x
    calls = []

    def never(X, y, names):
        calls.append(names)
        return sp.Integer(0), "no", False

    assert residue_formula(np.stack([s, x], 1), y, ("s", "x"), (2, 3, 4, 5, 6), 1e-3, never) is None
    assert len(calls) == MAX_REGRESSIONS < 3


def test_an_output_with_too_many_variables_is_read_over_what_its_sub_mlps_read():
    """Dithering, seed 1's model (session 38): the output reads linear terms in t, a routed x and an
    unread sub-MLP beside the sub-MLP of (sum_x, x) that decides; too many variables for the pair
    search, while the deciding sub-MLP and its neighbours read four. Over those: the task's rule."""
    task = mips.get("Dithering")
    program = extract(wtc.load(MODELS / "Dithering_seed1"), task)
    assert program.ok, program.failures
    assert {s.name for s in program.outputs[0].free_symbols} == {"sum_x", "x"}, program.outputs
    namespace: dict = {}
    exec(program.source, namespace)
    x = np.random.default_rng(16).integers(0, 16, (200, 40))
    got = np.array([namespace["program"](s.tolist()) for s in x])
    np.testing.assert_array_equal(got, mips.dithering(x, 15))                 # whole numbers, exactly
