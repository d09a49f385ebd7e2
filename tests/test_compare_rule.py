"""The "latest j before t whose key compares so with the query at t" routing rule (a content head
that finds an earlier value above x_t): its keys against a plain loop, a head following it found
by the reader, its program line exec'd from source, and the model of sorted_so_far whose content
head follows it read and verified."""
import operator
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

import wtc
from wtc.extraction import extract, verify
from wtc.extraction.program import Line, build_source
from wtc.extraction.routing_rules import Rule, fit_head, routed, rule_keys

from planting import run_source, sorted_so_far  # noqa: E402  (tests/ is on sys.path)

T, P = 8, 7
MODELS = Path(__file__).parent / "models"
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def loop_keys(k, q, op, strict):
    """Key index of the latest j < t (j <= t) with k_j op q_t, 0 (a pad) if none; k, q (n, T)."""
    keys = np.zeros(k.shape, dtype=int)
    for i in range(k.shape[0]):
        for t in range(T):
            last = t - 1 if strict else t
            keys[i, t] = next((P + j for j in range(last, -1, -1) if OPS[op](k[i, j], q[i, t])), 0)
    return keys


def _pad(v):
    return np.concatenate([np.zeros((v.shape[0], P)), v], axis=1)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("strict", [True, False])
def test_the_rules_keys_are_a_plain_loops(rng, op, strict):
    k, q = rng.integers(0, 5, (300, T)).astype(float), rng.integers(0, 5, (300, T)).astype(float)
    rule = Rule("compare", {"var": "k", "query": "q", "op": op, "strict": strict})
    np.testing.assert_array_equal(rule_keys(rule, {"k": _pad(k), "q": _pad(q)}, P, T), loop_keys(k, q, op, strict))


def test_a_head_that_follows_it_is_read_so_and_its_line_runs_from_source(rng):
    x = rng.integers(0, 4, (600, T)).astype(float)
    keys = loop_keys(x, x, ">", True)
    fit = fit_head("h", keys, "x", {"x": _pad(x)}, P, T, window_vars=["x"], query_vars=["x"])
    assert fit.rule is not None and fit.rule.kind == "compare", [c.describe() for c in fit.candidates]
    assert fit.rule.describe() == "latest j < t where x_j > x_t (0 if none)"
    line = Line("above", "route", "x", fit.rule)
    source = build_source("above", 1, 1, ["x"], [line], [sp.Symbol("above")])
    fresh = rng.integers(0, 4, (50, 2 * T)).astype(float)          # twice the length: the line, not a table
    want = [[next((s[j] for j in range(t - 1, -1, -1) if s[j] > s[t]), 0.0) for t in range(2 * T)] for s in fresh]
    np.testing.assert_array_equal(run_source(source, fresh), want)
    np.testing.assert_array_equal(routed(_pad(x), keys, P), routed(_pad(x), rule_keys(fit.rule, {"x": _pad(x)}, P, T), P))


def test_the_content_head_of_a_sorted_prefix_reads_as_the_latest_earlier_value_above_x():
    """The other model of sorted_so_far (tests/models/sorted_so_far_content): its content head routes
    an earlier value above x_t where there is one (0.85 of positions the latest one, the rest
    another), a sub-MLP of that value alone is positive where it is not 0, and a prefix max of
    the sub-MLP says a descent happened: the prefix is sorted while it has not."""
    task = sorted_so_far()
    program = extract(wtc.load(MODELS / "sorted_so_far_content"), task)
    assert program.ok, program.failures
    route = next(ln for ln in program.lines if ln.kind == "route")
    assert route.rule.kind == "compare" and route.rule.params == {"var": "x", "query": "x", "op": ">", "strict": True}
    v = verify(program, task, n=2000, seed=10)
    assert v.solved and v.holds_longer and v.holds_longest and v.exhaustive_ok, v
    x = np.random.default_rng(18).integers(0, 4, (300, 40))
    x[:100] = np.sort(x[:100], axis=1)
    np.testing.assert_array_equal(run_source(program.source, x), task.target(x))
