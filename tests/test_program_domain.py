"""Programs know their domain: recorded at extraction, written into the standalone source, checked
by Program.__call__ under its switch; verification refuses a target that is not a function."""
import json
import types
import warnings

import numpy as np
import pytest
import sympy as sp
from test_extract import planted     # the planted-model helper: no training from scratch

import wtc
from wtc.extraction import extract, verify
from wtc.extraction.domain import MAX_VALUES, ChannelDomain, Domain, DomainError
from wtc.extraction.program import (Line, Program, ProgramDomainError, ProgramDomainWarning, ProgramInputError,
                                    ProgramOutputError, build_source)
from wtc.extraction.routing_rules import Rule
from wtc.extraction.verification import VerificationError


@pytest.fixture(scope="module")
def parity():
    task, model = planted("parity_last2", [1], [("x", "L0.h0")])
    program = extract(model, task)
    assert program.ok, program.failures
    return task, program


@pytest.fixture(scope="module")
def xor():
    task, model = planted("xor_pair", [0], [("x0", "x1")])
    program = extract(model, task)
    assert program.ok, program.failures
    return task, program


def standalone(program: Program) -> types.ModuleType:
    """The emitted source in a fresh module: only what it imports itself."""
    module = types.ModuleType("emitted_program")
    exec(program.source, module.__dict__)
    return module


def items(seq: np.ndarray, n_inputs: int) -> list:
    return seq[:, 0].tolist() if n_inputs == 1 else [tuple(r) for r in seq.tolist()]


def sum_program(domain: Domain | None, seq_len: int = 4) -> Program:
    """x + prev1_x by hand (no model), with the given domain."""
    rule = Rule("offset", {"d": 1}, 1, 1)
    lines = [Line("prev1_x", "route", "x", rule)]
    expr = sp.Symbol("x") + sp.Symbol("prev1_x")
    src = build_source("demo", 1, 1, ["x"], lines, [expr], domain=domain)
    return Program("demo", src, seq_len, 1, 1, lines, [expr])


# ---------------------------------------------------------------------- recorded at extraction
def test_extraction_records_the_domain_seen(parity, xor):
    task, program = parity
    assert program.domain == Domain((ChannelDomain("x", values=(0.0, 1.0), integer=True),),
                                    (task.seq_len, 2 * task.seq_len), any_length=True)
    _, program2 = xor
    assert [ch.values for ch in program2.domain.channels] == [(0.0, 1.0), (0.0, 1.0)]
    assert [ch.name for ch in program2.domain.channels] == ["x0", "x1"]
    row = next(r for r in program.readings if r.module == "domain")     # in the report's module table
    assert row.finding == program.domain.describe() and "one of 0, 1" in row.finding


def test_ranges_are_rounded_outward_and_many_integers_are_a_range(rng):
    x = np.stack([rng.uniform(-1, 1, (512, 10)), rng.integers(0, 1000, (512, 10)),
                  rng.integers(-3, 4, (512, 10))], axis=2).astype(float)
    d = Domain.from_samples(x, ["u", "n", "k"], 10, any_length=False)
    u, n, k = d.channels
    assert (u.values, u.low, u.high, u.integer) == (None, -1.0, 1.0, False)
    assert n.values is None and n.integer and n.low >= 0 and n.high <= 999 and n.high - n.low > MAX_VALUES
    assert k.values == tuple(float(v) for v in range(-3, 4))
    fresh = np.stack([rng.uniform(-1, 1, (512, 10)), rng.integers(0, 1000, (512, 10)),
                      rng.integers(-3, 4, (512, 10))], axis=2).astype(float)
    fresh[:, :, 1] = np.clip(fresh[:, :, 1], n.low, n.high)
    assert d.violation(fresh) is None
    fresh[3, 5, 1] += 0.5                                       # integers only: 0.5 steps are outside
    got = d.violation(fresh)
    assert (got.sequence, got.position, got.channel) == (3, 5, "n")


def test_domain_round_trips_through_json():
    d = Domain((ChannelDomain("a", values=(0.0, 1.0, 7.0)), ChannelDomain("b", low=-2.5, high=1e3),
                ChannelDomain("c", low=0.0, high=99.0, integer=True)), (12,), any_length=False)
    back = Domain.from_dict(json.loads(json.dumps(d.to_dict())))
    assert back == d
    with pytest.raises(DomainError, match="neither values nor a range"):
        Domain.from_dict({**d.to_dict(), "channels": [{"name": "a", "values": None, "low": 2.0, "high": 1.0,
                                                        "integer": False}]})
    with pytest.raises(DomainError, match="malformed"):
        Domain.from_dict({"channels": []})


# ---------------------------------------------------------------------- the standalone source
def test_standalone_source_matches_the_program_in_domain(parity, xor, rng):
    for task, program in (parity, xor):
        module = standalone(program)
        assert module.DOMAIN == program.domain.to_dict()
        x, _ = task.batch(rng, 64)
        fresh = np.array([module.program(items(seq, task.n_inputs)) for seq in x])
        np.testing.assert_array_equal(fresh, program(x))


def test_standalone_source_refuses_what_it_was_not_verified_on(parity, xor):
    par, xr = standalone(parity[1]), standalone(xor[1])
    with pytest.raises(ValueError, match=r"xs\[0\], channel x = -1 is outside the domain .*one of 0, 1"):
        par.program([-1, -1, 2, 3])
    with pytest.raises(ValueError, match=r"xs\[2\], channel x = 0.5 is outside"):
        par.program([0, 1, 0.5, 1])
    with pytest.raises(ValueError, match=r"xs\[1\], channel x: '1' is not a number"):
        par.program([0, "1"])
    with pytest.raises(ValueError, match=r"xs\[0\] is 1; expected a tuple of 2 numbers \(x0, x1\)"):
        xr.program([1, 0])
    with pytest.raises(ValueError, match=r"xs\[0\] is \(1, 0, 1\); expected a tuple of 2 numbers"):
        xr.program([(1, 0, 1), (0, 0, 1)])
    with pytest.raises(ValueError, match=r"xs\[0\], channel x0 = 2 is outside"):
        xr.program([(2, 3)])
    # the documented way round the check: the formula as read, outside where it was read
    assert xr.program([(2, 3)], check_domain=False) == [-7.0]
    assert par.program([-1, -1, 2, 3], check_domain=False) == [-1.0, -4.0, 5.0, -7.0]


def test_standalone_ranges_and_numpy_scalars():
    real = Domain((ChannelDomain("x", low=-1.0, high=1.0),), (3,), any_length=False)
    whole = Domain((ChannelDomain("x", low=0.0, high=99.0, integer=True),), (3,), any_length=False)
    r, w = standalone(sum_program(real, 3)), standalone(sum_program(whole, 3))
    assert r.program([-1, 0.25, np.float64(1.0)]) == [-1.0, -0.75, 1.25]
    with pytest.raises(ValueError, match=r"xs\[1\], channel x = 1.5 is outside .*\(reals in \[-1, 1\]\)"):
        r.program([0, 1.5, 0])
    with pytest.raises(ValueError, match=r"xs\[2\], channel x = nan is outside"):
        r.program([0, 0, float("nan")])
    assert w.program([np.int64(3), 4, 99]) == [3.0, 7.0, 103.0]            # numpy scalars: the slow path
    with pytest.raises(ValueError, match=r"xs\[0\], channel x = 2.5 is outside .*whole numbers in \[0, 99\]"):
        w.program([2.5, 1, 1])
    with pytest.raises(ValueError, match=r"xs\[0\], channel x = np.float64\(100.0\)|xs\[0\], channel x = 100.0"):
        w.program([np.float64(100.0), 1, 1])


def test_lengths_outside_the_domain(parity):
    fixed = Domain((ChannelDomain("x", values=(0.0, 1.0)),), (4,), any_length=False)
    program = sum_program(fixed)
    module = standalone(program)
    assert module.program([1, 0, 1, 1]) == [1.0, 1.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="xs has 5 items; this program was verified on sequences of length 4 only"):
        module.program([1, 0, 1, 1, 0])
    with pytest.raises(ProgramDomainError, match="T = 5: it was verified at T = 4 only"):
        program(np.ones((2, 5)))
    np.testing.assert_array_equal(program(np.ones((1, 5)), domain="ignore"), [[1, 2, 2, 2, 2]])
    task, par = parity                     # any_length: every length is in the domain
    x = np.ones((1, 3 * task.seq_len))
    np.testing.assert_array_equal(par(x), [standalone(par).program([1.0] * 3 * task.seq_len)])


# ---------------------------------------------------------------------- Program.__call__ and its switch
def test_program_call_under_each_switch(parity, xor):
    _, program = parity
    x = np.array([[0, 1, 0.5, 1]])
    with pytest.raises(ProgramDomainError, match=r"sequence 0, position 2, channel x = 0.5 \(its domain: one of "
                                                 r"0, 1\); program\(x, domain='warn'\)"):
        program(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warned = program(x, domain="warn")
    assert [w.category for w in caught] == [ProgramDomainWarning]
    assert "position 2, channel x = 0.5" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ignored = program(x, domain="ignore")
    expected = [standalone(program).program([0, 1, 0.5, 1], check_domain=False)]
    np.testing.assert_array_equal(warned, expected)
    np.testing.assert_array_equal(ignored, expected)
    with pytest.raises(ProgramInputError, match="domain= must be one of 'error', 'warn', 'ignore', got 'off'"):
        program(x, domain="off")
    _, two = xor
    for mode in ("error", "warn", "ignore"):     # a wrong channel count is never computed
        with pytest.raises(ProgramInputError, match=r"takes \(n, T, 2\) inputs"):
            two(np.array([[(1, 0, 1), (0, 0, 1)]]), domain=mode)
    with pytest.raises(ProgramDomainError, match="channel x0 = 2"):
        two(np.array([[(2, 3)]]))
    assert two(np.array([[(2, 3)]]), domain="ignore").tolist() == [[-7.0]]


def test_non_finite_outputs_from_finite_inputs():
    wide = Domain((ChannelDomain("x", low=-1e308, high=1e308),), (2,), any_length=True)
    program = sum_program(wide, seq_len=2)
    x = np.array([[1e308, 1e308]])
    with pytest.raises(ProgramOutputError, match=r"gave inf at index \(0, 1\) .* from finite inputs"):
        program(x)
    with pytest.warns(ProgramDomainWarning, match=r"gave inf at index \(0, 1\)"):
        assert program(x, domain="warn").tolist() == [[1e308, np.inf]]
    assert program(x, domain="ignore").tolist() == [[1e308, np.inf]]


def test_domain_and_source_must_agree():
    d = Domain((ChannelDomain("x", values=(0.0, 1.0)),), (4,))
    program = sum_program(d)
    other = Domain((ChannelDomain("x", values=(0.0,)),), (4,))
    with pytest.raises(DomainError, match="differs from the DOMAIN its source records"):
        Program("demo", program.source, 4, 1, 1, domain=other)
    with pytest.raises(DomainError, match="2 channel"):
        Program("demo", sum_program(None).source, 4, 1, 1,
                domain=Domain((ChannelDomain("a", values=(0.0,)), ChannelDomain("b", values=(0.0,))), (4,)))


# ---------------------------------------------------------------------- saved programs
def test_saved_programs_keep_their_domain_and_old_ones_load_without(parity):
    from wtc.discover_job import plain_json, program_from_dict, program_to_dict

    _, program = parity
    saved = json.loads(json.dumps(program_to_dict(program), default=plain_json))
    assert Domain.from_dict(saved["domain"]) == program.domain
    back = program_from_dict(saved)
    assert back.domain == program.domain
    del saved["domain"]
    assert program_from_dict(saved).domain == program.domain  # also read back from the source's DOMAIN
    old = dict(saved, source=build_source(program.task, 1, 1, ["x"], program.lines, program.outputs))
    # a file written before domains: no 'domain' key, a source without DOMAIN
    legacy = program_from_dict(old)
    assert legacy.domain is None and "DOMAIN" not in legacy.source
    np.testing.assert_array_equal(legacy(np.array([[0.5, 1, 0, 2]])),
                                  program(np.array([[0.5, 1, 0, 2]]), domain="ignore"))


# ---------------------------------------------------------------------- verification
def test_verify_scores_draws_beyond_the_extraction_sample(rng):
    """A value the extraction sample missed is scored (and fails), not refused."""
    narrow = Domain((ChannelDomain("x", values=(0.0,)),), (10, 20), any_length=True)
    rule = Rule("offset", {"d": 1}, 1, 1)
    lines = [Line("prev1_x", "route", "x", rule)]
    x, p = sp.Symbol("x"), sp.Symbol("prev1_x")
    expr = x + p - 2 * x * p
    program = Program("parity_last2", build_source("parity_last2", 1, 1, ["x"], lines, [expr], domain=narrow),
                      10, 1, 1, lines, [expr])
    assert verify(program, "parity_last2", n=200, seed=int(rng.integers(2**31))).solved


def test_verify_refuses_a_target_that_is_not_a_function():
    calls = {"n": 0}

    def target(x):          # the same inputs, other targets on every call
        calls["n"] += 1
        return (x + calls["n"]) % 2

    task = wtc.Task("drifting", lambda rng, n: rng.integers(0, 2, (n, 6)), target, seq_len=6)
    with pytest.raises(VerificationError, match=r"task 'drifting': the target is not a function of its inputs: it "
                                                r"changed between two calls on the same 256 sequences \(first at "
                                                r"sequence 0, position 0"):
        verify(lambda x: x, task, n=300, seed=0)
    steady = wtc.Task("steady", lambda rng, n: rng.integers(0, 2, (n, 6)), lambda x: x % 2, seq_len=6)
    assert verify(lambda x: x, steady, n=300, seed=0).solved
