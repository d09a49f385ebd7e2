"""The MIPS suite (wtc.tasks.mips), the suite runner (wtc.suite) and exhaustive verification
(wtc.extraction.exhaustive). No model is trained here: discover is replaced where a run is needed."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from wtc import suite
from wtc.discovery import Discovery
from wtc.extraction import verify
from wtc.extraction.exhaustive import check, every_sequence, lengths
from wtc.extraction.verification import Verification, _run
from wtc.tasks import Task, mips


# ---------------------------------------------------------------- the suite as data
def test_the_suite_has_the_62_tasks_of_the_paper_once_each():
    assert len(mips.SUITE) == 62 == mips.PUBLISHED["tasks"]
    assert len(set(mips.names())) == 62
    assert len({e.source for e in mips.SUITE}) == 62
    assert all(isinstance(e.mips_solved, bool) and isinstance(e.gpt4_solved, bool) for e in mips.SUITE)
    assert set(mips.OUTCOMES) == set(mips.names())


def test_the_per_task_outcomes_add_up_to_the_published_counts():
    mips_solved = {e.name for e in mips.SUITE if e.mips_solved}
    gpt4_solved = {e.name for e in mips.SUITE if e.gpt4_solved}
    assert len(mips_solved) == mips.PUBLISHED["mips_solved"] == 32
    assert len(gpt4_solved) == mips.PUBLISHED["gpt4_solved"] == 30
    assert len(mips_solved - gpt4_solved) == mips.PUBLISHED["mips_not_gpt4"] == 13
    assert len(gpt4_solved - mips_solved) == 11


@pytest.mark.parametrize("entry", mips.SUITE, ids=lambda e: e.name)
def test_each_generator_draws_the_declared_shapes_and_ranges(entry):
    task = entry.task()
    x, y = task.batch(np.random.default_rng(3), 200)
    assert x.shape == (200, entry.seq_len, entry.n_inputs)
    assert y.shape == (200, entry.seq_len, entry.n_outputs)
    for c, (lo, hi) in enumerate(entry.inputs):
        assert lo <= x[..., c].min() and x[..., c].max() < hi
        assert np.all(x[..., c] == np.round(x[..., c]))
    assert np.all(y == np.round(y))                 # every MIPS task has integer outputs
    if entry.any_length:                            # defined at every length: 2T draws and targets
        long = task.at_length(2 * entry.seq_len)
        xl, yl = long.batch(np.random.default_rng(4), 20)
        assert yl.shape == (20, 2 * entry.seq_len, entry.n_outputs)


def _y(name, *seq):
    """Targets of one hand-made sequence (a list of values, or of tuples for two channels)."""
    task = mips.get(name)
    x = np.array([list(seq)], dtype=float)
    x = np.concatenate([x, np.zeros((1, task.seq_len - x.shape[1]) + x.shape[2:])], axis=1)
    return task.public_shape(task.targets(x))[0].tolist()


def test_spot_checks_of_the_definitions():
    # carries: 1 + 1 = 10 (least significant first), 3 + 4 in base 5 = 12 (digits 2, 1)
    assert _y("Binary_Addition", (1, 1))[:3] == [0, 1, 0]
    assert _y("Binary_Addition", (1, 1), (1, 0), (0, 0))[:3] == [0, 0, 1]
    assert _y("Base_5_Addition", (3, 4))[:2] == [2, 1]
    # long division, most significant bit first: 1000010 / 11 = 0010110 (the generator's example)
    assert _y("Div_3", 1, 0, 0, 0, 0, 1, 0)[:7] == [0, 0, 1, 0, 1, 1, 0]
    assert _y("Div_5", 1, 1, 0, 1, 1, 1, 0)[:7] == [0, 0, 1, 0, 1, 1, 0]
    # ties of the majority go to the smaller value
    assert _y("Majority_0_2", 2, 1, 1, 2)[:4] == [2, 1, 1, 1]
    # balanced prefixes: ( ) ) ( never recovers once below zero
    assert _y("Balanced_Parenthesis", 0, 1, 1, 0, 1)[:5] == [0, 1, 0, 0, 0]
    assert _y("Bit_Palindrome", 1, 0, 1, 1)[:4] == [1, 0, 1, 0]
    assert _y("Alternating_Last3", 1, 0, 1, 0, 0)[:5] == [0, 1, 1, 1, 0]    # zeros before the start
    assert _y("Alternating_Last4", 1, 0, 1, 0)[:4] == [0, 0, 1, 1]
    assert _y("Previous_Equals_Current", 0, 0, 3)[:3] == [1, 1, 0]       # x_(-1) = 0
    assert _y("Diff_Abs_Values", -5, 3)[:2] == [5, -2]
    assert _y("Dithering", 7, 7, 7, 7)[:4] == [0, 0, 1, 0]               # sums 7, 14, 21, 28 over 15
    assert _y("Newton_Gravity", 0, 0, 0)[:3] == [-1, -3, -6]
    assert _y("Newton_Spring", 1, 0, 0)[:3] == [1, 1, 0]                 # v: 1, 0, -1; p: 1, 1, 0
    assert _y("Newton_Magnetic", (1, 0), (0, 0))[:2] == [[1, 0], [2, 1]]  # v (1,0), then a = (0, 1)
    assert _y("Parity_Bits_Mod2", 1, 1, 1)[:4] == [0, 1, 0, 1]
    assert _y("Sum_Last5", *range(1, 8))[:7] == [1, 3, 6, 10, 15, 20, 25]
    assert _y("Prev5", *range(1, 8))[:7] == [0, 0, 0, 0, 0, 1, 2]
    assert _y("Perfect_Square_Detector", 16, 15, 0)[:3] == [1, 0, 1]


def test_alternating_last3_at_the_start_counts_zeros_before_it():
    # (0, 0, 1) is not alternating; (0, 1, 0) is: the second position of 1, 0 looks at 0, 1, 0
    assert _y("Alternating_Last3", 1, 0)[:2] == [0, 1]


def test_palindrome_sampler_starts_with_a_palindrome():
    x = mips.palindrome_prefix_bits(10)(np.random.default_rng(0), 500)
    y = mips.is_palindrome_prefix(x)
    assert y[:, 1:].any(axis=1).all()          # a palindrome of length >= 2 at the start of every sequence


# ---------------------------------------------------------------- shards and tables
def test_shards_cover_every_task_exactly_once():
    s = suite.mips()
    for n in (1, 2, 3, 7, 62, 100):
        names = [i.name for k in range(1, n + 1) for i in s.shard(k, n)]
        assert sorted(names) == sorted(mips.names())
    assert [i.name for i in s.shard(2, 3)] == mips.names()[1::3]      # deterministic: every 3rd from the 2nd


@pytest.mark.parametrize("bad", ["0/2", "3/2", "2", "a/b", "1/0"])
def test_a_bad_shard_is_a_clear_error(bad):
    with pytest.raises(suite.SuiteError, match="shard"):
        suite.parse_shard(bad)


PROGRAM = "def program(xs):\n    return [float(v) for v in xs]\n"


def _fake_discover(calls):
    """discover's stand-in: 'solves' Current_Number and Bitwise_Not's cousin tasks with a program
    and a verification made by hand, fails every other task after one attempt; counts calls."""
    from wtc.extraction.program import Program

    def fake(task, seed=0, budget_s=None, progress=True, **kw):
        from wtc import tasks
        task = tasks.get(task)                        # the built-in suite passes names
        calls.append(task.name)
        if task.name == "Current_Number":
            program = Program(task.name, PROGRAM, task.seq_len, 1, 1)
            ver = Verification(1.0, 0.0, 10, None, True, seed)
            return Discovery(task, program, None, None, ver, 2.0, [{"attempt": 0, "label": "a", "replicas": 1,
                             "replicas_solved": 1, "replicas_read": 1, "verified": True, "seconds": 2.0}],
                             budget_s=budget_s)
        return Discovery(task, None, None, None, None, 3.0, [{"attempt": 0, "label": "a", "replicas": 1,
                         "replicas_solved": 0, "replicas_read": 0, "verified": False, "seconds": 3.0}],
                         budget_s=budget_s)
    return fake


@pytest.fixture
def small_suite():
    """The MIPS suite cut to 5 tasks (the runner is the same for any list)."""
    full = suite.mips()
    keep = ("Current_Number", "Prev1", "Add_Mod_3", "Bitwise_Not", "Sum_All")
    return suite.Suite("mips", tuple(i for i in full.items if i.name in keep), full.published, full.note)


def test_a_rerun_skips_finished_tasks(tmp_path, monkeypatch, small_suite):
    from wtc import discovery
    calls = []
    monkeypatch.setattr(discovery, "discover", _fake_discover(calls))
    rows = suite.run(small_suite, tmp_path, budget_s=5, progress=False, echo=lambda s: None)
    assert len(calls) == 5 and len(rows) == 5
    assert (tmp_path / "Current_Number" / "program.py").read_text() == PROGRAM
    solved = {r["name"]: r["solved"] for r in rows}
    assert solved["Current_Number"] and not solved["Prev1"]
    assert {r["name"]: r["failure_class"] for r in rows}["Prev1"] == "not learned"
    assert {r["name"]: r["body_lines"] for r in rows}["Current_Number"] == 1      # the algorithm, not the file
    calls.clear()
    again = suite.run(small_suite, tmp_path, budget_s=5, progress=False, echo=lambda s: None)
    assert calls == []                                   # nothing run twice
    assert again == rows
    (tmp_path / "Prev1" / "result.json").unlink()        # an unfinished task runs again, alone
    suite.run(small_suite, tmp_path, budget_s=5, progress=False, echo=lambda s: None)
    assert calls == ["Prev1"]


def test_only_runs_the_named_tasks_in_order_and_tables_the_whole_suite(tmp_path, monkeypatch, small_suite):
    from wtc import discovery
    calls = []
    monkeypatch.setattr(discovery, "discover", _fake_discover(calls))
    quiet = dict(progress=False, echo=lambda s: None, budget_s=5)
    suite.run(small_suite, tmp_path, only=["Sum_All", "Prev1"], **quiet)
    assert calls == ["Sum_All", "Prev1"]                 # the order asked for, not the suite's
    suite.run(small_suite, tmp_path, only=["Current_Number"], **quiet)   # a later run beside them
    assert calls[-1] == "Current_Number"
    table = (tmp_path / "results.md").read_text()
    assert "wtc: 1 solved of 3 run (5 in the suite)" in table
    with pytest.raises(suite.SuiteError, match="not tasks of suite 'mips'.*Nope"):
        suite.run(small_suite, tmp_path, only=["Nope"], **quiet)


def test_another_seed_in_the_same_directory_is_refused(tmp_path, monkeypatch, small_suite):
    from wtc import discovery
    monkeypatch.setattr(discovery, "discover", _fake_discover([]))
    suite.run(small_suite, tmp_path, seed=0, progress=False, echo=lambda s: None)
    with pytest.raises(suite.SuiteError, match="seed"):
        suite.run(small_suite, tmp_path, seed=1, progress=False, echo=lambda s: None)


def test_merged_shards_give_the_single_run_table(tmp_path, monkeypatch, small_suite):
    from wtc import discovery
    monkeypatch.setattr(discovery, "discover", _fake_discover([]))
    quiet = dict(progress=False, echo=lambda s: None, budget_s=5)
    suite.run(small_suite, tmp_path / "single", **quiet)
    suite.run(small_suite, tmp_path / "a", shard=(1, 2), **quiet)
    suite.run(small_suite, tmp_path / "b", shard=(2, 2), **quiet)
    merged = suite.write_table(small_suite, [tmp_path / "a", tmp_path / "b"], tmp_path / "merged")
    single = (tmp_path / "single" / "results.md").read_text()
    assert (tmp_path / "merged" / "results.md").read_text() == single
    assert (tmp_path / "merged" / "results.csv").read_text() == (tmp_path / "single" / "results.csv").read_text()
    assert sorted(merged) == sorted(i.name for i in small_suite.items)
    assert "wtc: 1 solved of 5 run (5 in the suite)" in single
    assert "MIPS: 5/5" in single and "wtc solved where MIPS did not: 0" in single   # all five: MIPS solved them
    a_only = (tmp_path / "a" / "results.md").read_text()
    assert "not run" in a_only                                                         # a shard alone says so


def test_conflicting_results_for_one_task_are_an_error(tmp_path, monkeypatch, small_suite):
    from wtc import discovery
    monkeypatch.setattr(discovery, "discover", _fake_discover([]))
    quiet = dict(progress=False, echo=lambda s: None)
    suite.run(small_suite, tmp_path / "a", **quiet)
    suite.run(small_suite, tmp_path / "b", **quiet)
    path = tmp_path / "b" / "Prev1" / "result.json"
    row = json.loads(path.read_text())
    row["solved"] = True
    path.write_text(json.dumps(row))
    with pytest.raises(suite.SuiteError, match="Prev1 has two different results"):
        suite.collect(small_suite, [tmp_path / "a", tmp_path / "b"])
    # runs one after another (a newer engine): the last directory's row is the one kept
    assert suite.collect(small_suite, [tmp_path / "a", tmp_path / "b"], latest=True)["Prev1"]["solved"] is True
    assert suite.collect(small_suite, [tmp_path / "b", tmp_path / "a"], latest=True)["Prev1"]["solved"] is False


def test_the_cli_runs_a_shard_and_merges(tmp_path, monkeypatch, small_suite):
    from wtc import cli, discovery
    monkeypatch.setattr(discovery, "discover", _fake_discover([]))
    monkeypatch.setitem(suite.SUITES, "mips", lambda: small_suite)
    assert cli.main(["discover", "--suite", "mips", "--shard", "1/2", "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert cli.main(["discover", "--suite", "mips", "--shard", "2/2", "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert cli.main(["suite-table", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 0
    assert "not run" not in (tmp_path / "m" / "results.md").read_text()
    assert cli.main(["discover", "Prev1", "--suite", "mips"]) == 2          # one of TASK, --all, --suite
    assert cli.main(["discover", "--suite", "mips", "--shard", "3/2"]) == 2


def test_the_cli_runs_named_tasks_and_tables_later_runs(tmp_path, monkeypatch, small_suite, capsys):
    from wtc import cli, discovery
    calls = []
    monkeypatch.setattr(discovery, "discover", _fake_discover(calls))
    monkeypatch.setitem(suite.SUITES, "mips", lambda: small_suite)
    run = ["discover", "--suite", "mips", "--quiet", "--out"]
    assert cli.main(run + [str(tmp_path / "a"), "--tasks", "Sum_All,Prev1"]) == 0
    assert calls == ["Sum_All", "Prev1"]
    assert cli.main(run + [str(tmp_path / "b"), "--tasks", "Prev1"]) == 0
    row = tmp_path / "b" / "Prev1" / "result.json"
    row.write_text(row.read_text().replace('"solved": false', '"solved": true', 1))    # a newer engine's row
    table = ["suite-table", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]
    assert cli.main(table) == 2                                                   # two results: refused ...
    assert cli.main(table + ["--latest"]) == 0                                    # ... unless runs in order
    assert "wtc: 1 solved of 2 run (5 in the suite)" in (tmp_path / "m" / "results.md").read_text()
    capsys.readouterr()
    assert cli.main(run + [str(tmp_path / "c"), "--tasks", "Prev1,Nope"]) == 2
    assert "not tasks of suite 'mips' shard 1/1: Nope" in capsys.readouterr().err
    assert cli.main(["discover", "Prev1", "--tasks", "Prev1"]) == 2


def test_discover_all_runs_through_the_same_runner(tmp_path, monkeypatch):
    from wtc import cli, discovery, tasks
    calls = []
    monkeypatch.setattr(discovery, "discover", _fake_discover(calls))
    assert cli.main(["discover", "--all", "--out", str(tmp_path), "--quiet"]) == 1      # must tasks not solved
    assert calls == tasks.names()
    table = (tmp_path / "results.md").read_text()
    assert "| tier |" in table and "| parity_last2 | no |" in table
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["name"] for r in rows] == tasks.names() and rows[0]["columns"]["tier"] == "must"


# ---------------------------------------------------------------- exhaustive verification
def _bits_task(seq_len=4):
    def sample(rng, n):
        return rng.integers(0, 2, size=(n, seq_len))
    return Task("prefix_parity_bits", sample, lambda x: np.cumsum(x, axis=1) % 2, seq_len=seq_len, any_length=True)


def _parity_program(wrong_after_ones: int | None):
    """Prefix parity, except (when wrong_after_ones) at a position reached through that many ones
    in a row from the start: a rare sequence (1 in 2^k) that a sample of a few hundred misses."""
    def program(x):
        x = np.asarray(x)[..., 0] if np.ndim(x) == 3 else np.asarray(x)
        out = np.cumsum(x, axis=1) % 2
        if wrong_after_ones is not None and x.shape[1] >= wrong_after_ones:
            rare = np.all(x[:, :wrong_after_ones] == 1, axis=1)
            out[rare, wrong_after_ones - 1] = 1 - out[rare, wrong_after_ones - 1]
        return out.astype(float)
    return program


def test_exhaustive_check_catches_a_program_right_on_samples_but_wrong_on_a_rare_sequence():
    task = _bits_task()
    wrong = _parity_program(wrong_after_ones=13)
    v = verify(wrong, task, n=300, seed=5)
    assert v.accuracy == 1.0 and v.max_rel_err == 0.0        # the samples (T, 2T, 4T) never meet 13 ones in a row
    assert v.holds_longer and v.holds_longest
    assert v.exhaustive is not None and not v.exhaustive["solved"]
    assert v.exhaustive["max_length"] == 13 and v.exhaustive["sequences"] == sum(2 ** k for k in range(1, 14))
    assert v.exhaustive["sequences"] - v.exhaustive["agree"] == 1      # the one all-ones sequence of length 13
    assert v.exhaustive["first_wrong"]["inputs"] == [[1.0]] * 13 and v.exhaustive["first_wrong"]["position"] == 12
    assert not v.solved and "exhaustive up to length 13" in str(v)
    right = verify(_parity_program(None), task, n=300, seed=5)
    assert right.solved and right.exhaustive["solved"] and right.exhaustive["agree"] == right.exhaustive["sequences"]


def test_exhaustive_check_enumerates_every_sequence_once():
    alphabet = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    xs = every_sequence(alphabet, 3)
    assert xs.shape == (27, 3, 2)
    assert len({tuple(map(tuple, s)) for s in xs.tolist()}) == 27
    assert {tuple(map(tuple, s)) for s in xs.tolist()} == set(itertools.product(map(tuple, alphabet.tolist()), repeat=3))
    assert lengths(2, 1, cap=2 ** 14) == list(range(1, 14))
    assert lengths(10, 1, cap=2 ** 14) == [1, 2, 3, 4]


def test_exhaustive_check_skips_fixed_length_and_wide_domains():
    fixed = mips.get("Bit_Palindrome")                 # drawn with structure: defined at T = 10 only
    x = fixed.draw(0, 50)
    assert check(lambda z: z, fixed, x, _run) is None
    wide = mips.get("Sum_All")                         # 100 values per position
    assert check(lambda z: z, wide, wide.draw(0, 2000), _run) is None
    small = mips.get("Add_Mod_3")
    rec = check(lambda z: np.cumsum(z[..., 0], axis=1) % 3, small, small.draw(0, 500), _run)
    assert rec["solved"] and rec["symbols"] == 3 and rec["max_length"] == 8


def test_a_callable_written_for_one_length_is_checked_at_that_length_only():
    task = _bits_task(seq_len=4)

    def four_only(x):
        x = np.asarray(x)[..., 0]
        if x.shape[1] != 4:
            raise ValueError("written for T = 4")
        return (np.cumsum(x, axis=1) % 2).astype(float)

    rec = check(four_only, task, task.draw(0, 200), _run)
    assert rec["solved"] and rec["lengths"] == [4] and rec["sequences"] == 16
    assert rec["not_run_at"] == [L for L in range(1, 14) if L != 4]
