"""Two-valued outputs of two-valued variables read as their shortest rule
(wtc.extraction.logic): exact on every point, the fewest atoms, refused where no rule is."""
import itertools

import numpy as np
import pytest
import sympy as sp

from wtc.extraction.logic import Atom, shortest_rule
from wtc.extraction.program import expression_ast


def _table(k, rng, n=400):
    rows = rng.integers(0, 2, (n, k)).astype(float)
    return {f"v{i}": rows[:, i] for i in range(k)}, rows


def _evaluate(rule, columns):
    names = sorted(columns)
    f = sp.lambdify([sp.Symbol(n) for n in names], rule.expr(), modules="numpy")
    return np.broadcast_to(np.asarray(f(*[columns[n] for n in names]), dtype=float), columns[names[0]].shape)


def test_alternating_bits_read_as_a_chain_of_inequalities(rng):
    columns, rows = _table(4, rng)
    d = np.all(rows[:, 1:] != rows[:, :-1], axis=1).astype(float)
    rule = shortest_rule(columns, d)
    assert set(rule.atoms) == {Atom("v0", "!=", "v1"), Atom("v1", "!=", "v2"), Atom("v2", "!=", "v3")}
    assert (rule.when, rule.otherwise) == (1.0, 0.0)
    np.testing.assert_array_equal(_evaluate(rule, columns), d)
    import ast
    text = ast.unparse(expression_ast(rule.expr(), set(columns)))        # as the program prints it
    assert text.count("!=") == 3 and "[t]" in text


def test_a_disjunction_is_the_negated_conjunction_and_other_levels_are_kept(rng):
    columns, rows = _table(3, rng)
    d = np.where((rows[:, 0] == 1) | (rows[:, 2] == 0), 5.0, 2.0)     # = 2 where v0 == 0 and v2 == 1
    rule = shortest_rule(columns, d)
    assert set(rule.atoms) == {Atom("v0", "==", value=0.0), Atom("v2", "==", value=1.0)}
    assert (rule.when, rule.otherwise) == (2.0, 5.0)
    np.testing.assert_array_equal(_evaluate(rule, columns), d)


def test_the_fewest_atoms_win(rng):
    columns, rows = _table(3, rng)
    d = (rows[:, 0] != rows[:, 1]).astype(float)
    assert shortest_rule(columns, d).atoms == (Atom("v0", "!=", "v1"),)


@pytest.mark.parametrize("case", ["parity of 3", "three values", "not a function", "one level", "too many atoms"])
def test_what_no_short_rule_states_is_refused(rng, case):
    columns, rows = _table(5, rng, n=2000)
    if case == "parity of 3":                       # x0 ^ x1 ^ x2: no conjunction of atoms
        d = rows[:, :3].sum(1) % 2
    elif case == "three values":
        columns["v0"] = rows[:, 0] * 2 + rows[:, 1]
        d = rows[:, 0]
    elif case == "not a function":
        d = rng.integers(0, 2, len(rows)).astype(float)
    elif case == "one level":
        d = np.ones(len(rows))
    else:                                            # all five alternate: four relations needed ... plus one
        d = (np.all(rows[:, 1:] != rows[:, :-1], axis=1) & (rows[:, 0] == 1)).astype(float)
    assert shortest_rule(columns, d) is None


def test_every_two_atom_rule_over_three_bits_is_found_back():
    grid = np.array(list(itertools.product((0.0, 1.0), repeat=3)))
    columns = {f"v{i}": grid[:, i] for i in range(3)}
    from wtc.extraction.logic import _atoms
    atoms = _atoms(sorted(columns), [(0.0, 1.0)] * 3)
    for a, b in itertools.combinations(atoms, 2):
        d = np.ones(len(grid))
        for atom in (a, b):
            x = columns[atom.a]
            y = columns[atom.b] if atom.b else atom.value
            d *= (x == y) if atom.op == "==" else (x != y)
        if 0 < d.sum() < len(d):
            rule = shortest_rule(columns, d)
            np.testing.assert_array_equal(_evaluate(rule, columns), d)
            assert len(rule.atoms) <= 2


def _alternating(x, w=3):
    pad = np.concatenate([np.zeros((x.shape[0], w - 1)), x], 1)
    return np.stack([np.all(pad[:, t + 1:t + w] != pad[:, t:t + w - 1], 1) for t in range(x.shape[1])],
                    1).astype(float)


def test_a_planted_alternation_reads_as_integer_decisions_that_hold_at_four_times_the_length(rng):
    """The model's head sums two sub-MLPs; whatever formula a regression finds for it, the program's
    values are its decisions (a rule where the formula only rounds right), from its source, at 4T."""
    import wtc
    from wtc.extraction import extract, verify

    from test_extract import planted

    task = wtc.Task("alternating3", lambda rng, n: rng.integers(0, 2, (n, 10)), _alternating, seq_len=10,
                    output="integer")
    task, model = planted(task, [1, 2], [("x", "L0.h0"), ("L0.h0", "L0.h1")])
    program = extract(model, task)
    assert program.ok, program.failures
    assert verify(program, task, n=2000, seed=7).solved
    namespace: dict = {}
    exec(program.source, namespace)
    longer = rng.integers(0, 2, (300, 40)).astype(float)
    got = np.array([namespace["program"](s.tolist(), check_domain=False) for s in longer])
    np.testing.assert_array_equal(got, _alternating(longer))         # exact values, not values that round
