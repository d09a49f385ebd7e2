"""An output that is a function of the position alone, read as its period
(wtc.extraction.position): t % 2 for a task that ignores its bits, from the model's decisions."""
import numpy as np
import pytest
import sympy as sp

from wtc.extraction.position import PositionTable, position_table


def _positions(n, T):
    return np.tile(np.arange(T), (n, 1))


@pytest.mark.parametrize("values", [(0.0, 1.0), (1.0, 0.0, 0.0), (2.0, 5.0, 5.0, 7.0), (4.0,)])
def test_the_shortest_period_and_its_table(values):
    t = _positions(50, 12)
    d = np.asarray(values)[t % len(values)]
    table = position_table(t, d)
    assert table == PositionTable(len(values), values)
    f = sp.lambdify([sp.Symbol("t")], table.expr(sp.Symbol("t")), modules="numpy")
    longer = np.arange(48)
    np.testing.assert_array_equal(np.broadcast_to(f(longer), longer.shape), np.asarray(values)[longer % len(values)])


def test_a_phase_linear_table_is_written_as_the_modulus():
    assert position_table(_positions(5, 10), _positions(5, 10) % 2).expr(sp.Symbol("t")) == sp.Mod(sp.Symbol("t"), 2)


def test_outputs_that_read_more_than_the_position_or_never_repeat_are_refused(rng):
    t = _positions(40, 10)
    assert position_table(t, rng.integers(0, 2, t.shape)) is None        # two decisions at one position
    assert position_table(t, (t >= 7).astype(float)) is None             # no period of at most T/2
    assert position_table(t[:, :9], np.asarray([0, 1, 0, 1, 0, 1, 0, 1, 1.0])[t[:, :9]]) is None
