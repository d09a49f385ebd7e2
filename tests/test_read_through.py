"""Readings that trained models needed (tests/models: best models of the MIPS suite's runs and
experiments, as discover saved them): an output read over what an unread sub-MLP reads, an integer
output read over fewer variables as a formula whose values are its decisions, a switch that goes
to the pads read as "nothing" rather than as the offset the pads sit at for the length trained on,
votes over prefix means read as the argmax of the inputs' prefix counts, and a content head read
as its best rule because the whole program keeps every decision with it. Each
program is exec'd from its source and checked against the task's own definition at four times
the length it was read at."""
from pathlib import Path

import numpy as np
import sympy as sp

import wtc
from wtc.extraction import extract, verify
from wtc.extraction.formulas import integral_formula
from wtc.extraction.routing_rules import fit_head, rule_keys
from wtc.tasks import mips

from planting import sorted_so_far  # noqa: E402  (tests/ is on sys.path)

MODELS = Path(__file__).parent / "models"


def _source_program(program):
    namespace: dict = {}
    exec(program.source, namespace)                       # as a user runs it: the source, in a fresh namespace
    return namespace["program"]


def test_an_output_is_read_over_what_an_unread_sub_mlp_reads():
    """Division by 5: the sub-MLP between the weighted sum and the output is periodic in the sum
    and fits no formula; the quotient bit read over the sub-MLP's own inputs is (x + s mod 5) mod 2."""
    task = mips.get("Div_5")
    program = extract(wtc.load(MODELS / "Div_5"), task)
    assert program.ok, program.failures
    out = program.outputs[0]
    assert {s.name for s in out.free_symbols} == {"x", "per4_x"}, out
    assert any(r.kind == "note" and "L0.m2" in r.finding for r in program.readings)   # said, not hidden
    v = verify(program, task, n=2000, seed=3)
    assert v.solved and v.holds_longest and v.exhaustive_ok, v
    x = np.random.default_rng(11).integers(0, 2, (200, 40))
    run = _source_program(program)
    got = np.array([run(s.tolist()) for s in x])
    np.testing.assert_array_equal(got, mips.long_division(x, 5))


def test_an_unread_sub_mlp_among_weak_linear_terms_is_read_through_over_fewer_variables():
    """Division by 3 in two layers: the sub-MLP periodic in the alternating sum fits no formula,
    and the output also reads two prefix means weakly (linear terms): four variables in all, more
    than one regression reads whole; one or two of them as a whole-number formula is the reading."""
    task = mips.get("Div_3")
    program = extract(wtc.load(MODELS / "Div_3"), task)
    assert program.ok, program.failures
    assert {s.name for s in program.outputs[0].free_symbols} == {"x", "per2_x"}, program.outputs
    v = verify(program, task, n=2000, seed=5)
    assert v.solved and v.holds_longest and v.exhaustive_ok, v
    x = np.random.default_rng(13).integers(0, 2, (200, 40))
    got = np.array([_source_program(program)(s.tolist()) for s in x])
    np.testing.assert_array_equal(got, mips.long_division(x, 3))


def test_a_switch_to_the_pads_reads_as_nothing_and_the_parity_as_a_modulus():
    """Dot product parity: the head routes b where a = 1 and goes to the pads where a = 0 (read as
    offset 10 before, which reads real positions at length 20); the output, read by the
    regression over the routed bit, its prefix sum and prefix mean as |cos(1.6 s + 1.41)|, is
    Mod(s, 2) over the sum alone."""
    task = mips.get("Bit_Dot_Prod_Mod2")
    program = extract(wtc.load(MODELS / "Bit_Dot_Prod_Mod2"), task)
    assert program.ok, program.failures
    switch = next(ln for ln in program.lines if ln.rule is not None and ln.rule.kind == "switch")
    assert dict(switch.rule.params["table"]) == {0.0: None, 1.0: 0}, switch.rule.params
    s = sp.Symbol(f"sum_{switch.name}")
    assert program.outputs[0] == sp.Mod(s, 2), program.outputs
    v = verify(program, task, n=2000, seed=4)
    assert v.solved and v.holds_longer and v.holds_longest, v
    x = np.random.default_rng(12).integers(0, 2, (200, 40, 2))
    run = _source_program(program)
    got = np.array([run([tuple(r) for r in s.tolist()]) for s in x])
    np.testing.assert_array_equal(got, mips.dot_product_parity(x))


def test_a_vote_over_prefix_means_is_read_as_the_argmax_of_the_counts():
    """Majority of 0..2 in two layers: mean_x, the mean of a sub-MLP of x (the model's second
    frequency), then a sub-MLP deciding among the three values: piecewise constant with linear
    boundaries over the two means, no formula. The means are functions of the prefix counts of x;
    over those the decisions are the argmax of the counts, ties to the smaller value."""
    task = mips.get("Majority_0_2")
    program = extract(wtc.load(MODELS / "Majority_0_2"), task)
    assert program.ok, program.failures
    assert {s.name for s in program.outputs[0].free_symbols} == {"n_x_0", "n_x_1", "n_x_2"}, program.outputs
    counts = {ln.name: ln for ln in program.lines if ln.kind == "sum"}
    assert set(counts) == {"n_x_0", "n_x_1", "n_x_2"} and counts["n_x_2"].source == "is_x_2"
    v = verify(program, task, n=2000, seed=6)
    assert v.solved and v.holds_longer and v.holds_longest and v.exhaustive_ok, v
    x = np.random.default_rng(14).integers(0, 3, (200, 40))
    got = np.array([_source_program(program)(s.tolist()) for s in x])
    np.testing.assert_array_equal(got, mips.majority(x, 2))


def test_a_vote_the_network_gets_wrong_near_a_few_ties_reads_as_the_plain_argmax():
    """Majority of 0..3 (the prefix-statistics rung, 6000 steps): right on 0.9995 of fresh positions,
    so no formula or exact reading fits; over the counts the simplest scores that keep 0.99 of its
    decisions are the counts themselves, not scores bent to its misses (19 n0 + 2 n1 against
    21 n1 - 2 n3 ..., which discover read before and which fails at 2T)."""
    task = mips.get("Majority_0_3")
    program = extract(wtc.load(MODELS / "Majority_0_3"), task, seed=3)
    assert program.ok, program.failures
    want = sp.Piecewise((0, (sp.Symbol("n_x_0") >= sp.Symbol("n_x_1")) & (sp.Symbol("n_x_0") >= sp.Symbol("n_x_2"))
                         & (sp.Symbol("n_x_0") >= sp.Symbol("n_x_3"))),
                        (1, (sp.Symbol("n_x_1") >= sp.Symbol("n_x_2")) & (sp.Symbol("n_x_1") >= sp.Symbol("n_x_3"))),
                        (2, sp.Symbol("n_x_2") >= sp.Symbol("n_x_3")), (3, True))
    assert program.outputs[0] == want, program.outputs
    v = verify(program, task, n=2000, seed=7)
    assert v.solved and v.holds_longer and v.holds_longest and v.exhaustive_ok, v
    x = np.random.default_rng(15).integers(0, 4, (200, 40))
    got = np.array([_source_program(program)(s.tolist()) for s in x])
    np.testing.assert_array_equal(got, mips.majority(x, 3))


def test_a_vote_between_two_inputs_is_read_over_both_inputs_counts():
    """A task of the user's own (lambdas): 1 where channel a has had more ones than channel b so far.
    Neither input's counts alone decide it; both together do (as zeros: at equal lengths, more
    zeros in a is fewer ones)."""
    task = wtc.Task("more_ones_in_a", lambda rng, n: rng.integers(0, 2, (n, 10, 2)),
                    lambda x: (np.cumsum(x[..., 0], axis=1) > np.cumsum(x[..., 1], axis=1)).astype(int),
                    seq_len=10, n_inputs=2, any_length=True)
    program = extract(wtc.load(MODELS / "vote_two_channels"), task)
    assert program.ok, program.failures
    used = {s.name for s in program.outputs[0].free_symbols}
    assert len(used) == 2 and {u.split("_")[1] for u in used} == {"x0", "x1"}, program.outputs
    v = verify(program, task, n=2000, seed=8)
    assert v.solved and v.holds_longer and v.holds_longest and v.exhaustive_ok, v
    x = np.random.default_rng(16).integers(0, 2, (200, 40, 2))
    run = _source_program(program)
    got = np.array([run([tuple(r) for r in s.tolist()]) for s in x])
    np.testing.assert_array_equal(got, np.cumsum(x[..., 0], axis=1) > np.cumsum(x[..., 1], axis=1))


def test_integral_formula_reads_over_the_fewest_variables(rng):
    x = (rng.integers(0, 2, (3000, 10)) * rng.integers(0, 2, (3000, 10))).astype(float)
    s = np.cumsum(x, axis=1)
    columns = {"a": x.ravel(), "s": s.ravel(), "m": (s / np.arange(1, 11)).ravel()}
    expr, evidence = integral_formula(columns, (s % 2).ravel(), 0.05)
    assert expr == sp.Mod(sp.Symbol("s"), 2), expr
    assert "whole numbers" in evidence
    noise = rng.integers(0, 3, s.size).astype(float)       # a function of none of them: nothing is read
    assert integral_formula(columns, noise, 0.05) is None


def test_a_switch_entry_is_nothing_where_the_head_goes_to_the_pads(rng):
    n, T, P = 1000, 8, 8          # 8000 picks: the acceptance bound needs over 4600 agreeing
    q = rng.integers(0, 2, (n, T)).astype(float)
    v = rng.integers(0, 5, (n, T)).astype(float)
    pads = np.zeros((n, P))
    values = {"q": np.concatenate([pads, q], axis=1), "v": np.concatenate([pads, v], axis=1)}
    t = np.arange(T)[None, :]
    pointer = np.where(q == 1, P + t - 1, rng.integers(0, P, (n, T)))     # q = 1: t - 1; q = 0: some pad
    pointer = np.maximum(pointer, 0)
    fit = fit_head("h", pointer, "v", values, P, T, query_vars=["q"])
    assert fit.rule is not None and fit.rule.kind == "switch", fit
    assert dict(fit.rule.params["table"]) == {0.0: None, 1.0: 1}
    keys = rule_keys(fit.rule, values, P, T)
    assert np.all(keys[q == 0] < P)                        # a pad: the value 0
    assert "0 (nothing)" in fit.rule.describe()


def test_a_head_its_rule_misses_is_read_as_the_rule_when_the_whole_program_keeps_every_decision():
    """A task of the user's own (lambdas): 1 while the prefix is still sorted. The model (the
    prefix-extremes rung) compares x_t with a content head's value and takes the prefix max of that
    comparison. The head routes "some earlier value above x_t" where there is one, not always the
    largest: its best rule, the argmax before t, routes the same value on only 0.77 of positions,
    yet with it the whole program makes every one of the model's decisions, so it reads as that rule.
    The comparison's sub-MLP (a table on x and the routed value) reaches the output only through one
    cut of its prefix max, so it reads as the indicator of that cut: 1 - (x >= max_beforerun_x)."""
    task = sorted_so_far()
    program = extract(wtc.load(MODELS / "sorted_so_far"), task)
    assert program.ok, program.failures
    head = next(r for r in program.readings if r.module == "L0.h1")
    assert head.ok and 0.5 <= float(head.evidence.split()[1]) < 0.9 and "whole program" in head.evidence, head
    extreme = next(ln for ln in program.lines if ln.kind in ("max", "min"))
    assert program.outputs == [1 - sp.Symbol(extreme.name)], program.outputs      # "no descent so far"
    comparison = next(ln for ln in program.lines if ln.name == extreme.source).expr
    assert {s.name for s in comparison.free_symbols} == {"x", "max_beforerun_x"} and sp.count_ops(comparison) <= 3
    v = verify(program, task, n=2000, seed=9)
    assert v.solved and v.holds_longer and v.holds_longest and v.exhaustive_ok, v
    x = np.random.default_rng(17).integers(0, 4, (300, 40))
    x[:100] = np.sort(x[:100], axis=1)                     # sorted throughout: the rare case at 4T
    got = np.array([_source_program(program)(s.tolist()) for s in x])
    np.testing.assert_array_equal(got, task.target(x))


def test_a_head_below_the_floor_stays_unread(monkeypatch):
    """The same model with the floor above its head's 0.77: the head is a failure of the reading."""
    from wtc.extraction import reader
    monkeypatch.setattr(reader, "PROGRAM_IMMATERIAL_RATE", 0.8)
    task = sorted_so_far()
    program = extract(wtc.load(MODELS / "sorted_so_far"), task)
    assert not program.ok and any(f.startswith("L0.h1: pointer fits no routing rule") for f in program.failures)
