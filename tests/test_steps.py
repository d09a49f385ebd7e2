"""A two-valued output read as one cut of one variable (wtc.extraction.steps): the cut is the
simplest number in the gap the model's decisions leave, so a majority reads `mean_x > 1/2`, not a
learned curve's crossing near it, and holds at lengths whose prefix means fall in that gap."""
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

import wtc
from wtc.extraction import extract, verify
from wtc.extraction.steps import one_step, simplest_between

from test_extract import planted


@pytest.mark.parametrize("low,high,lc,hc,want", [
    (0.5, 10 / 19, True, False, Fraction(1, 2)),      # [1/2, 10/19): 1/2 itself
    (0.5, 10 / 19, False, True, Fraction(10, 19)),    # (1/2, 10/19]: nothing simpler fits
    (3.0, 4.0, True, False, Fraction(3)),
    (3.0, 4.0, False, False, Fraction(7, 2)),
    (-2.5, -0.4, False, False, Fraction(-1)),          # the simplest, then nearest zero
    (-0.4, 0.3, False, False, Fraction(0)),
    (0.30, 0.34, False, False, Fraction(1, 3)),
])
def test_the_simplest_number_in_an_interval(low, high, lc, hc, want):
    got = simplest_between(low, high, low_closed=lc, high_closed=hc)
    assert got == want
    c = got.numerator / got.denominator
    assert (c >= low if lc else c > low) and (c <= high if hc else c < high)


def test_one_step_reads_the_cut_and_the_side_of_each_level(rng):
    means = np.array([k / n for n in range(1, 21) for k in range(n + 1)])
    v = rng.choice(means, 5000)
    step = one_step(v, (v > 0.5).astype(float))
    assert step.cut == Fraction(1, 2) and step.strict and (step.below, step.above) == (0.0, 1.0)
    down = one_step(v, np.where(v >= 0.25, 3.0, 7.0))             # falling, other levels
    assert down.cut == Fraction(1, 4) and not down.strict and (down.below, down.above) == (7.0, 3.0)
    x = sp.Symbol("mean_x")
    f = sp.lambdify([x], step.expr(x), modules="numpy")
    assert np.array_equal(f(v), (v > 0.5).astype(float))


@pytest.mark.parametrize("v,d", [
    (np.array([0, 1, 2, 3.0]), np.array([0, 1, 0, 1.0])),        # changes three times
    (np.array([0, 0, 1, 1.0]), np.array([0, 1, 1, 1.0])),        # not a function of v
    (np.array([0, 1, 2, 3.0]), np.array([0, 1, 2, 2.0])),        # three levels
    (np.array([0, 1, 2, 3.0]), np.array([1, 1, 1, 1.0])),        # one level
    (np.array([0, np.nan]), np.array([0, 1.0])),
])
def test_what_is_not_one_step_is_refused(v, d):
    assert one_step(v, d) is None


def _majority(x):
    """1 where ones outnumber zeros so far, ties to 0."""
    ones = np.cumsum(x, axis=1)
    return (2 * ones > np.arange(1, x.shape[1] + 1)).astype(float)


def test_a_planted_majority_reads_as_a_cut_of_the_prefix_mean_that_holds_at_four_times_the_length(rng):
    task = wtc.Task("majority_bits", lambda rng, n: rng.integers(0, 2, (n, 10)), _majority, seq_len=10,
                    output="integer")
    task, model = planted(task, [], [("L0.a0", "L0.a0")], aggregates=1)
    program = extract(model, task)
    assert program.ok, program.failures
    mean = sp.Symbol("mean_x")
    assert program.outputs[0] == sp.Piecewise((1, mean > sp.Rational(1, 2)), (0, True)), program.outputs
    assert verify(program, task, n=2000, seed=5).solved
    namespace: dict = {}
    exec(program.source, namespace)                       # as a user runs it: the source, fresh data, 4T
    longer = rng.integers(0, 2, (300, 40)).astype(float)
    got = np.array([namespace["program"](s.tolist(), check_domain=False) for s in longer])
    np.testing.assert_array_equal(got, _majority(longer))


def test_a_two_valued_output_of_one_bit_stays_a_formula():
    """Not: `1 - x`, not `0 if x > 0 else 1` (a step of a bit is an affine map of it)."""
    task = wtc.Task("not_bit", lambda rng, n: rng.integers(0, 2, (n, 10)), lambda x: 1 - x, seq_len=10,
                    output="integer")
    task, model = planted(task, [1], [("x", "x")])
    program = extract(model, task)
    assert program.ok, program.failures
    assert not program.outputs[0].has(sp.Piecewise), program.outputs
    assert sp.simplify(program.outputs[0] - (1 - sp.Symbol("x"))) == 0, program.outputs
