"""The attempt loop shared by wtc.train and wtc.discover: the ladder/budget policy (with fake
rungs, no training), budget validation, resume refusals, and discover's parallel rungs."""
import json
import math

import torch

import numpy as np
import pytest
import sympy as sp

import wtc
from wtc import checkpoint_io
from wtc.discovery import plain_json, program_from_dict, program_to_dict
from wtc.dt import DTConfig
from wtc.dt.attempt import Attempt
from wtc.dt.config import ConfigError
from wtc.dt.ladder import Ladder, check_budget, climb
from wtc.dt.train import train
from wtc.errors import CheckpointError
from wtc.extraction import Line, Program, Reading
from wtc.extraction.routing_rules import Rule

TINY = DTConfig(n_layers=1, n_heads=1, n_mlps=1, mlp_hidden=8, steps=20, hard_steps=5, polish_iters=5,
                replicas=2, max_attempts=1, batch_size=16, eval_sequences=64, precision_iters=10, workers=1)


class FakeRungs:
    """A runner of the ladder on a fake clock, as wtc.dt.workers.run_ladder runs it: `workers`
    slots, a new rung started as soon as one frees; rung i takes seconds[i] and scores keys[i]
    (solved when the key is at least 10); rungs no longer wanted are stopped; at kill_at every
    rung still running is killed (no result)."""

    def __init__(self, keys, seconds=None, kill_at=None):
        self.keys, self.seconds, self.kill_at = keys, seconds or [1.0] * len(keys), kill_at
        self.now, self.started, self.start_times = 0.0, [], []

    def clock(self):
        return self.now

    def __call__(self, ladder):
        running = {}                      # attempt -> when it ends
        while True:
            while len(running) < ladder.workers and (rung := ladder.next_rung()) is not None:
                self.started.append(rung.attempt)
                self.start_times.append(self.now)
                running[rung.attempt] = self.now + self.seconds[rung.attempt]
            if not running:
                return
            a = min(running, key=lambda k: (running[k], k))
            if self.kill_at is not None and running[a] > self.kill_at:
                self.now = self.kill_at
                return
            self.now = running.pop(a)
            ladder.done(a, (a, self.keys[a]))
            for b in [b for b in running if not ladder.wanted(b)]:
                del running[b]


def _climb(fake, workers, **kw):
    kw.setdefault("max_attempts", len(fake.keys))
    winner, ran, _ = climb(DTConfig(), fake, workers=workers, solved=lambda r: r[1] is not None and r[1] >= 10,
                           key=lambda r: r[1], clock=fake.clock, **kw)
    return winner, [rung.attempt for rung, _ in ran]


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_ladder_winner_is_the_sequential_one_for_any_workers(workers):
    # attempts 2 and 4 solve: the winner is 2 even when 3 and 4 ran beside it, and they are dropped
    winner, ran = _climb(FakeRungs([1, 5, 10, 3, 11]), workers)
    assert winner == (2, 10) and ran == [0, 1, 2]
    # a later rung that solves first does not win while an earlier one may still solve
    winner, ran = _climb(FakeRungs([1, 5, 10, 11, 3], seconds=[1, 1, 9, 1, 1]), workers)
    assert winner == (2, 10) and ran == [0, 1, 2]
    # none solves: the best key, the first of equals
    winner, ran = _climb(FakeRungs([1, 5, None, 5, 2]), workers)
    assert winner == (1, 5) and ran == [0, 1, 2, 3, 4]
    winner, ran = _climb(FakeRungs([None, None]), workers)
    assert winner is None and ran == [0, 1]


def test_ladder_rungs_climb_the_configs():
    fake = FakeRungs([1, 1, 1])
    _, _, ladder = climb(DTConfig(mlp_inputs=2), fake, workers=2, max_attempts=3, solved=lambda r: False,
                         key=lambda r: r[1], clock=fake.clock)
    seen = ladder.begun
    assert fake.started == [0, 1, 2]
    assert seen[0].config.mlp_inputs == 2 and seen[1].config.mlp_inputs == 3
    assert seen[1].label == DTConfig().rung(1)[0]


def test_a_free_worker_starts_the_next_rung_at_once():
    # rung 0 takes 1 s, rung 1 5 s: rungs 2 and 3 start at 1 and 2 s, not after rung 1 (waves took 6 s)
    fake = FakeRungs([0, 0, 0, 0], seconds=[1, 5, 1, 1])
    _climb(fake, 2)
    assert fake.start_times == [0, 0, 1, 2] and fake.now == 5


def test_ladder_budget_covers_half_the_longest_rung(caplog):
    caplog.set_level("INFO", logger="wtc")          # progress lines go to the "wtc" logger (wtc.progress)
    # one worker: after 0 (2 s) and 1 (5 s), 7 s spent + half the longest 2.5 s > 9 s: rung 2 does not start
    fake = FakeRungs([0] * 6, seconds=[2, 5, 1, 1, 1, 1])
    _, ran = _climb(fake, 1, budget_s=9, max_attempts=None)
    assert ran == [0, 1]
    # ... while 7 + 2.5 <= 10 s lets rung 2 start (its attempts keep the deadline themselves)
    fake = FakeRungs([0] * 6, seconds=[2, 5, 1, 1, 1, 1])
    _, ran = _climb(fake, 1, budget_s=10, max_attempts=None)
    assert ran[:3] == [0, 1, 2]
    # two workers: rung 1 ends at 1 s, so rungs 2 and 3 start while rung 0 runs on; then the budget says no
    fake = FakeRungs([0] * 5, seconds=[30, 1, 1, 1, 1])
    _, ran = _climb(fake, 2, budget_s=3, max_attempts=None)
    assert ran == [0, 1, 2, 3] and fake.start_times == [0, 0, 1, 2]
    # a rung still running counts as long as it has run: at 2 s rung 0 has run 2 s, and 2 + 1 > 2.6
    fake = FakeRungs([0] * 5, seconds=[30, 1, 1, 1, 1])
    _, ran = _climb(fake, 2, budget_s=2.6, max_attempts=None)
    assert ran == [0, 1, 2] and fake.start_times == [0, 0, 1]
    # the first rungs always run (their attempts stop at the deadline), and say so when they used the budget
    fake = FakeRungs([0] * 4, seconds=[30, 30, 1, 1])
    _, ran = _climb(fake, 2, budget_s=3, max_attempts=None, name="demo", progress=True)
    assert ran == [0, 1] and fake.started == [0, 1]
    assert "used the 3s budget" in caplog.text
    # every first rung killed at the budget (no result): the ladder still stops, and says what was cut
    fake = FakeRungs([0] * 4, seconds=[30, 30, 1, 1], kill_at=3.5)
    winner, ran, ladder = climb(DTConfig(), fake, workers=2, solved=lambda r: False, key=lambda r: r,
                                clock=fake.clock, budget_s=3)
    assert winner is None and ran == [] and fake.started == [0, 1]
    assert [(rung.attempt, wanted) for rung, wanted in ladder.unfinished()] == [(0, True), (1, True)]
    with pytest.raises(ConfigError, match="never ends"):
        _climb(FakeRungs([0]), 1, max_attempts=None)


def test_the_ladder_wants_a_rung_until_an_earlier_one_solved_or_failed():
    ladder = Ladder(DTConfig(), workers=2, solved=lambda r: r == "solved", key=lambda r: None, max_attempts=5)
    r0, r1, r2 = ladder.next_rung(), ladder.next_rung(), ladder.next_rung()
    ladder.done(1, "solved")
    assert ladder.wanted(0) and not ladder.wanted(2)            # rung 0 may still solve: it would win
    assert ladder.next_rung() is None                          # nothing after a solved rung starts
    ladder.done(0, "not solved")
    assert ladder.outcome() == ("solved", [(r0, "not solved"), (r1, "solved")])
    assert ladder.unfinished() == [(r2, False)]                # stopped, not cut
    ladder = Ladder(DTConfig(), workers=2, solved=lambda r: r == "solved", key=lambda r: None, max_attempts=5)
    r0, r1, r2 = ladder.next_rung(), ladder.next_rung(), ladder.next_rung()
    ladder.done(0, "not solved")
    ladder.failed(1, RuntimeError("rung 1 broke"))
    assert not ladder.wanted(2) and ladder.next_rung() is None
    with pytest.raises(RuntimeError, match="rung 1 broke"):     # what the sequential loop would have raised
        ladder.outcome()
    ladder.done(2, "solved")                                   # a later solve does not hide it
    with pytest.raises(RuntimeError, match="rung 1 broke"):
        ladder.outcome()
    with pytest.raises(ConfigError, match="workers must be"):
        Ladder(DTConfig(), workers=0, solved=bool, key=bool, max_attempts=1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0, 0.0, -1, True, False, "3", [3]])
def test_budget_must_be_finite_and_positive(bad):
    with pytest.raises(ConfigError, match=r"budget_s .*got " + __import__("re").escape(repr(bad))):
        check_budget(bad)
    with pytest.raises(ConfigError, match="budget_s"):
        train("prev2", TINY, budget_s=bad, progress=False)
    with pytest.raises(ConfigError, match="budget_s"):
        wtc.discover("prev2", budget_s=bad, progress=False)


def test_budget_accepts_numbers():
    assert check_budget(None) is None
    assert check_budget(3) == 3.0 and check_budget(np.float32(0.5)) == 0.5 and check_budget(np.int64(7)) == 7.0


def test_resume_refuses_another_runs_results(tmp_path):
    """Issue 15: resuming prev2 in sum_last2's directory returned the sum_last2 model."""
    train("sum_last2", TINY, seed=0, progress=False, checkpoint_dir=tmp_path)
    with pytest.raises(CheckpointError, match="task 'sum_last2', not 'prev2'"):
        train("prev2", TINY, seed=0, progress=False, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(CheckpointError, match="seed 0, not 1"):
        train("sum_last2", TINY, seed=1, progress=False, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(CheckpointError, match=r"different DTConfig \(steps=20, now 21\)"):
        train("sum_last2", TINY.replace(steps=21), seed=0, progress=False, checkpoint_dir=tmp_path, resume=True)
    # another result file copied in as attempt 0 of this run: the attempt recorded in it differs
    # (rewritten through checkpoint_io, so its digests are those of a file another run wrote)
    tensors, meta = checkpoint_io.read(tmp_path / "attempt0_result")
    meta["train_info"]["attempt"] = 3
    checkpoint_io.write_atomic(tmp_path / "attempt0_result", tensors, meta)
    with pytest.raises(CheckpointError, match="attempt 3, not 0"):
        train("sum_last2", TINY, seed=0, progress=False, checkpoint_dir=tmp_path, resume=True)
    # the ladder's own fields may change on resume (they do not change what an attempt computes);
    # a kept result that solved ends the ladder, so attempt 1 does not run
    meta["train_info"]["attempt"], meta["key"][0] = 0, True
    checkpoint_io.write_atomic(tmp_path / "attempt0_result", tensors, meta)
    model, _ = train("sum_last2", TINY.replace(workers=2, max_attempts=2), seed=0, progress=False,
                     checkpoint_dir=tmp_path, resume=True)
    assert model.train_info["task"] == "sum_last2" and not list(tmp_path.glob("attempt1*"))


def test_resume_in_workers_refuses_another_runs_state(tmp_path):
    """A worker's refusal comes back as the same CheckpointError (the CLI prints it as one line)."""
    cfg = TINY.replace(max_attempts=2, workers=2)
    Attempt(wtc.tasks.get("prev2"), cfg.rung(1)[1], seed=5, attempt=1).save(tmp_path / "attempt1")
    with pytest.raises(CheckpointError, match="seed 5, not 0"):
        train("prev2", cfg, seed=0, progress=False, checkpoint_dir=tmp_path, resume=True)


def test_program_round_trips_through_json():
    """What a discover worker hands back: expressions exact (srepr), rules and readings intact."""
    x, p = sp.symbols("x prev1_x")
    expr = sp.Max(x, p) * sp.Rational(1, 3) + sp.Float("0.1234567890123") * x**2 - sp.Abs(p) + sp.Min(0, x - p)
    lines = [Line("prev1_x", "route", "x", Rule("offset", {"d": np.int64(1), "before": "pad"}, np.int64(9), 10)),
             Line("x_by_f", "route", "x", Rule("switch", {"var": "f", "table": [(0.0, 1), (1.0, 2)]}, 5, 6)),
             Line("m", "expr", expr=expr, comment="sub-MLP")]
    source = "import math\ndef program(xs):\n    return [2.0 * v for v in xs]\n"
    prog = Program("demo", source, 4, 1, 1, lines, [expr, x + 1], ok=False, failures=["L0.m1: no formula"],
                   readings=[Reading("L0.m0", "mlp", "m", "x, prev1_x", "max", "rmse 0", True, False)])
    back = program_from_dict(json.loads(json.dumps(program_to_dict(prog), default=plain_json)), model="m")
    assert back.outputs == prog.outputs and [ln.expr for ln in back.lines] == [ln.expr for ln in prog.lines]
    assert [ln.rule and (ln.rule.describe(), ln.rule.agree) for ln in back.lines] == \
        [ln.rule and (ln.rule.describe(), ln.rule.agree) for ln in prog.lines]
    assert back.readings == prog.readings and (back.ok, back.failures, back.model) == (False, prog.failures, "m")
    assert back([[1, 2, 3, 4]]).tolist() == [[2, 4, 6, 8]]


def test_discover_rungs_in_workers_give_the_sequential_result():
    """workers=2 runs rungs 0 and 1 at once in worker processes (the program comes back serialised);
    rung 0 verifies, so both pick it and keep one attempt record."""
    cfg = DTConfig(n_heads=2, n_mlps=1, mlp_hidden=8, steps=150, hard_steps=20, polish_iters=20, replicas=4,
                   batch_size=32, eval_sequences=256, precision_iters=0)
    seq = wtc.discover("sum_last2", seed=0, budget_s=60, progress=False, config=cfg.replace(workers=1))
    par = wtc.discover("sum_last2", seed=0, budget_s=60, progress=False, config=cfg.replace(workers=2))
    assert seq.solved and par.solved
    assert par.program.source == seq.program.source
    assert par.program.outputs == seq.program.outputs and par.program.failures == seq.program.failures
    assert [(ln.name, ln.kind, ln.source, ln.expr, ln.rule and ln.rule.describe()) for ln in par.program.lines] == \
        [(ln.name, ln.kind, ln.source, ln.expr, ln.rule and ln.rule.describe()) for ln in seq.program.lines]
    assert par.program.readings == seq.program.readings and par.verification == seq.verification
    strip = [{k: v for k, v in a.items() if k != "seconds"} for a in seq.attempts]
    assert [{k: v for k, v in a.items() if k != "seconds"} for a in par.attempts] == strip and len(strip) == 1
    x, _ = wtc.tasks.get("sum_last2").batch(np.random.default_rng(3), 16)
    np.testing.assert_array_equal(par.model.predict(x), seq.model.predict(x))
    np.testing.assert_array_equal(par.program(x), seq.program(x))
    assert par.history.final == seq.history.final and par.model.train_info == seq.model.train_info


# ---------------------------------------------------------------- the float64 precision pass's policy
def _score(accuracy, solved=False, max_abs_err=1.0):
    return {"solved": solved, "accuracy": accuracy, "max_abs_err": max_abs_err, "mean_rel_err": 0.1}


def _precision_run(monkeypatch):
    """A frozen tiny attempt whose polish is a fake: each call records (replicas, dtype, iters) and
    returns the next of `ratios` as every replica's loss after / before."""
    import torch

    import wtc.dt.attempt as attempt_mod

    run = Attempt(wtc.tasks.get("sum_last2"), TINY, seed=0, attempt=0)
    run.model.freeze()
    calls, ratios = [], []

    def fake_polish(model, x, y, valid, iters, until=None):
        calls.append((model.R, x.dtype, iters))
        return torch.full((model.R,), ratios.pop(0), dtype=torch.float64)

    monkeypatch.setattr(attempt_mod, "polish", fake_polish)
    return run, calls, ratios


def test_precision_pass_is_skipped_when_a_replica_is_already_solid(monkeypatch):
    run, calls, _ = _precision_run(monkeypatch)
    scores = [_score(1.0, solved=True, max_abs_err=0.1), _score(0.9)]
    assert run.precision_pass(scores) is scores and calls == []


def test_precision_pass_polishes_a_replica_solved_without_margin_first(monkeypatch):
    """A replica solved on fresh data but not solid (max_abs_err > 0.4) is what the pass polishes
    first, with the closest unsolved one; the pass ends once it is solid."""
    import wtc.dt.attempt as attempt_mod

    run, calls, ratios = _precision_run(monkeypatch)
    run.config = run.config.replace(precision_iters=4 * attempt_mod.PRECISION_CHUNK)
    picked = []
    select = run.model.select_replicas
    monkeypatch.setattr(run.model, "select_replicas", lambda idx: picked.append(list(idx)) or select(idx))
    monkeypatch.setattr(run, "evaluate", lambda n: [_score(0.9), _score(1.0, solved=True, max_abs_err=0.2)])
    ratios += [0.5, 0.5, 0.5, 0.5]
    run.precision_pass([_score(0.9), _score(1.0, solved=True, max_abs_err=0.45)])
    assert picked == [[1, 0]] and len(calls) == 1


def test_precision_pass_stops_when_a_chunk_gains_nothing(monkeypatch):
    import torch

    import wtc.dt.attempt as attempt_mod

    run, calls, ratios = _precision_run(monkeypatch)
    run.config = run.config.replace(precision_iters=4 * attempt_mod.PRECISION_CHUNK)
    monkeypatch.setattr(run, "evaluate", lambda n: [_score(0.9), _score(0.9)])
    ratios += [0.5, 0.999, 0.5, 0.5]     # the second chunk lowers no loss by PRECISION_GAIN
    run.precision_pass([_score(0.9), _score(0.88)])
    assert len(calls) == 2 and all(c[1] == torch.float64 for c in calls)
    assert calls[0][0] == attempt_mod.PRECISION_REPLICAS


def test_precision_pass_runs_its_chunks_while_the_loss_falls(monkeypatch):
    import wtc.dt.attempt as attempt_mod

    run, calls, ratios = _precision_run(monkeypatch)
    run.config = run.config.replace(precision_iters=3 * attempt_mod.PRECISION_CHUNK)
    monkeypatch.setattr(run, "evaluate", lambda n: [_score(0.9), _score(0.9)])
    ratios += [0.5, 0.5, 0.5]
    run.precision_pass([_score(0.9), _score(0.88)])
    assert len(calls) == 3


# ---------------------------------------------------------------- training stops at the budget
def test_training_stops_at_the_budget_and_a_resume_continues_it(tmp_path, caplog):
    """The first wave's training used to ignore the budget (--steps 10**12 --budget 1 never ended):
    it stops at the deadline, the model is finished as it stands and says so, and a resume trains
    on from the saved state to the planned end."""
    import time

    cfg = TINY.replace(steps=10**9, hard_steps=0, polish_iters=1, precision_iters=0)
    t0 = time.perf_counter()
    model, history = train("prev2", cfg, budget_s=1.0, progress=True, checkpoint_dir=tmp_path)
    assert time.perf_counter() - t0 < 120                # not 10**9 steps
    stopped = model.train_info["stopped_at_step"]
    assert 0 < stopped < 10**9 and history.final["planned_steps"] == 10**9
    assert "budget ran out at step" in caplog.text
    short = TINY.replace(steps=stopped + 20, hard_steps=0, polish_iters=1, precision_iters=0)
    with pytest.raises(CheckpointError):                # another config's state is refused, as before
        train("prev2", short, progress=False, checkpoint_dir=tmp_path, resume=True)


def test_a_resume_trains_on_after_a_budget_stop(tmp_path):
    cfg = TINY.replace(steps=400, hard_steps=0, polish_iters=1, precision_iters=0)
    first, h1 = train("prev2", cfg, budget_s=0.5, progress=False, checkpoint_dir=tmp_path)
    assert "stopped_at_step" in first.train_info
    resumed, h2 = train("prev2", cfg, progress=False, checkpoint_dir=tmp_path, resume=True)
    assert "stopped_at_step" not in resumed.train_info and "stopped_at_step" not in h2.final
    straight, h3 = train("prev2", cfg, progress=False)
    assert h2.step == h3.step                                   # the resumed curves reach the planned end
    for (k, a), (_, b) in zip(resumed.state_dict().items(), straight.state_dict().items()):
        assert torch.equal(a, b), k                              # and the model is the uninterrupted one


def test_a_fresh_run_refuses_to_overwrite_another_runs_checkpoints(tmp_path):
    cfg = TINY.replace(max_attempts=1)
    train("prev2", cfg, seed=0, progress=False, checkpoint_dir=tmp_path)
    before = (tmp_path / "attempt0_result.json").read_bytes()
    with pytest.raises(CheckpointError, match="another run's checkpoint.*task 'prev2', not 'sum_last2'"):
        train("sum_last2", cfg, seed=0, progress=False, checkpoint_dir=tmp_path)
    with pytest.raises(CheckpointError, match="seed 0, not 1"):
        train("prev2", cfg, seed=1, progress=False, checkpoint_dir=tmp_path)
    assert (tmp_path / "attempt0_result.json").read_bytes() == before       # nothing was overwritten
    train("prev2", cfg, seed=0, progress=False, checkpoint_dir=tmp_path)     # the same run starts over there


def test_prestarted_workers_give_the_same_discovery_and_are_stopped():
    """wtc.worker_pool: interpreters started before the wave take its rungs (their pids run them)
    with the same result as fresh workers; a pool closed with workers still waiting stops them."""
    from wtc.worker_pool import Prestarted

    cfg = DTConfig(n_heads=2, n_mlps=1, mlp_hidden=8, steps=150, hard_steps=20, polish_iters=20, replicas=4,
                   batch_size=32, eval_sequences=256, precision_iters=0, workers=2)
    fresh = wtc.discover("sum_last2", seed=0, budget_s=60, progress=False, config=cfg)
    with Prestarted(3) as pool:
        waiting = [proc for proc, _ in pool._idle]
        warm = wtc.discover("sum_last2", seed=0, budget_s=60, progress=False, config=cfg, prestarted=pool)
        assert len(pool._idle) == 1                                # two rungs took two of the three
        assert all(proc.poll() is not None for proc in waiting[:2])
        left = waiting[2]
    assert left.poll() is not None                                 # closed: the unused one is gone
    assert warm.solved and warm.program.source == fresh.program.source
    assert warm.verification == fresh.verification and warm.history.final == fresh.history.final
    x, _ = wtc.tasks.get("sum_last2").batch(np.random.default_rng(3), 16)
    np.testing.assert_array_equal(warm.model.predict(x), fresh.model.predict(x))


def test_programs_with_integer_operators_round_trip():
    """wtc.sr's indicators and floor division inside products came back as sympy's relational Ge
    (refused in a Mul: a discover on is_prime_digit crashed reading its worker's result)."""
    from wtc.sr.expr import Eq, FloorDiv, Ge, In

    x, y = sp.symbols("x prev1_x")
    out = 2 * Ge(x, 5) + FloorDiv(x, 3) * Eq(x, y) + sp.Mod(x, 2) + 3 * In(y, 2, 3, 5, 7)
    prog = Program("t", "def program(xs):\n    return xs\n", 4, 1, 1, [Line("m0", "expr", expr=3 * Ge(x, y))], [out])
    back = program_from_dict(json.loads(json.dumps(program_to_dict(prog), default=plain_json)))
    assert back.outputs == [out] and back.lines[0].expr == prog.lines[0].expr
    assert isinstance(back.outputs[0].atoms(Ge).pop(), Ge) and back.outputs[0].atoms(FloorDiv)
    assert back.outputs[0].atoms(In) == {In(y, 2, 3, 5, 7)}


FORK_SCRIPT = r"""
import json, threading
import numpy as np
import wtc
from wtc.dt import DTConfig, workers

workers.allow_fork()                      # as the CLI does, before any work
launched = []
fork = workers._fork
workers._fork = lambda spec, log, task: launched.append(spec["attempt"]) or fork(spec, log, task)
cfg = DTConfig(n_heads=2, n_mlps=1, mlp_hidden=8, steps=150, hard_steps=20, polish_iters=20, replicas=4,
               batch_size=32, eval_sequences=256, precision_iters=0, workers=2)
forked = wtc.discover("sum_last2", seed=0, budget_s=60, progress=False, config=cfg)
first = sorted(launched)
stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()    # a thread since allow_fork: no more forks
spawned = wtc.discover("sum_last2", seed=0, budget_s=60, progress=False, config=cfg)
stop.set()
x, _ = wtc.tasks.get("sum_last2").batch(np.random.default_rng(3), 16)
print(json.dumps({"first": first, "after_thread": sorted(launched[len(first):]),
                  "same_source": forked.program.source == spawned.program.source,
                  "same_verification": forked.verification == spawned.verification,
                  "same_final": forked.history.final == spawned.history.final,
                  "same_predictions": bool(np.array_equal(forked.model.predict(x), spawned.model.predict(x))),
                  "solved": forked.solved}))
"""


def test_forked_workers_give_the_same_discovery_as_interpreters(tmp_path):
    """wtc.dt.workers.allow_fork (the CLI's way): a fresh process forks its rung workers; once it
    has started a thread it starts interpreters instead, and both give the same discovery."""
    import subprocess
    import sys

    (tmp_path / "run.py").write_text(FORK_SCRIPT)
    done = subprocess.run([sys.executable, str(tmp_path / "run.py")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["first"] == [0, 1] and got["after_thread"] == [], got
    assert got["solved"] and got["same_source"] and got["same_verification"] and got["same_final"], got
    assert got["same_predictions"], got
LIBRARY_FORK_SCRIPT = r"""
import json, threading
import numpy as np
import torch
import wtc
from wtc.dt import DTConfig, workers

launched = []
fork = workers._fork
workers._fork = lambda spec, log, task: launched.append(spec["attempt"]) or fork(spec, log, task)
task = wtc.Task("flip_c", sample=lambda rng, n: rng.integers(0, 2, size=(n, 6)), target=lambda x: 1 - x, seq_len=6)
cfg = DTConfig(n_heads=1, n_mlps=1, mlp_hidden=8, steps=150, hard_steps=20, polish_iters=20, replicas=4,
               batch_size=32, eval_sequences=256, precision_iters=0, workers=2)
runs, counts = [], []
for case in ("fresh", "openmp", "thread"):
    if case == "openmp":                  # an OpenMP pool started after wtc was imported
        torch.set_num_threads(2)
        a = torch.randn(1500, 1500)
        (a @ a).sum()
        torch.set_num_threads(1)
    if case == "thread":
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
    before = len(launched)
    runs.append(wtc.discover(task, seed=0, budget_s=60, progress=False, config=cfg))
    counts.append(sorted(launched[before:]))
stop.set()
x, _ = task.batch(np.random.default_rng(3), 16)
print(json.dumps({"forked": counts, "solved": runs[0].solved,
                  "same_source": all(r.program.source == runs[0].program.source for r in runs),
                  "same_verification": all(r.verification == runs[0].verification for r in runs),
                  "same_predictions": all(bool(np.array_equal(r.model.predict(x), runs[0].model.predict(x)))
                                          for r in runs)}))
"""


def test_a_library_caller_forks_its_workers_while_fresh(tmp_path):
    """wtc.discover from user code, a task of lambdas: workers are forked while the process has
    started no thread since wtc loaded its workers module; after an OpenMP pool or a Python thread
    they are interpreters; every way gives the same discovery."""
    import subprocess
    import sys

    (tmp_path / "run.py").write_text(LIBRARY_FORK_SCRIPT)
    done = subprocess.run([sys.executable, str(tmp_path / "run.py")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["forked"] == [[0, 1], [], []], got
    assert got["solved"] and got["same_source"] and got["same_verification"] and got["same_predictions"], got


