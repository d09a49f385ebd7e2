"""Discover on ordinary machines: callable tasks train in worker processes from a pool drawn in the
parent (same result for any number of workers), and the budget is kept by every stage (training,
the polish, reading replicas out, workers past the deadline), each checked with deadlines that
have already passed (no timing in tests)."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import wtc
from wtc.discover_job import JUDGED_ON, DiscoverJob, judged
from wtc.discovery import Discovery, DiscoveryError, sized_for
from wtc.dt import DTConfig
from wtc.dt.attempt import Attempt, run_attempt
from wtc.dt.finish import polish
from wtc.dt.ladder import Deadline, Ladder, Rung, margin_s
from wtc.dt.workers import POOL, job_task, run_ladder
from wtc.errors import TaskError
from wtc.extraction import extract
from wtc.extraction.formulas import ExtractionTimeout
from wtc.extraction.reader import ExtractionInputError
from wtc.tasks import pool
from wtc.tasks.probe import dependence

TINY = DTConfig(n_layers=1, n_heads=1, n_mlps=1, mlp_hidden=8, steps=30, hard_steps=5, polish_iters=5,
                replicas=2, max_attempts=2, batch_size=16, eval_sequences=64, precision_iters=0)


def _prev_plus(x):
    y = x.astype(float)
    y[:, 1:] += x[:, :-1]
    return y


def callable_task(name="user_sum2"):
    """Declared the way a user declares one: lambdas, not a built-in."""
    return wtc.Task(name, lambda rng, n: rng.integers(0, 5, (n, 6)), _prev_plus, seq_len=6, any_length=True)


def long_ago() -> Deadline:
    now = time.time()
    return Deadline(now - 100.0, now - 50.0)


# ---------------------------------------------------------------------- the pool
def test_pool_stands_for_the_callable_task(tmp_path):
    task = callable_task()
    jt = job_task(task, seed=3)
    assert jt.ref == POOL and jt.pooled
    pooled = jt.task
    assert pooled.name == task.name and pooled.fingerprint() == task.fingerprint() and pooled.any_length
    x, y = pooled.batch(np.random.default_rng(0), 50)
    np.testing.assert_array_equal(y, task.targets(x))                       # the user's targets, recorded
    check, n = pooled.verification(10000)
    assert n == 10000 and check.at_length(12).seq_len == 12                 # readings are checked at 2T too
    xl, yl = check.at_length(12).batch(np.random.default_rng(1), 20)
    np.testing.assert_array_equal(yl, task.at_length(12).targets(xl))
    jt.pool.save(tmp_path / "p.npz")
    back = pool.Pool.read(tmp_path / "p.npz").task()                        # what a worker rebuilds
    xb, yb = back.batch(np.random.default_rng(0), 50)
    np.testing.assert_array_equal(xb, x)
    np.testing.assert_array_equal(yb, y)
    with pytest.raises(TaskError, match="recorded sequences"):
        pooled.targets(np.full((1, 6), 7.0))                               # never drawn: not in the pool
    assert job_task(task, seed=3).pool.train[0].tobytes() == jt.pool.train[0].tobytes()   # seeded


def test_builtin_and_data_tasks_are_not_pooled():
    assert job_task(wtc.tasks.get("prev2"), 0).ref == "prev2"


def test_callable_task_rungs_run_in_workers_with_the_sequential_result():
    """The rungs of a task declared with lambdas go to worker processes, and give the model that
    training them one after another in this process gives (both train on the same pool)."""
    task = callable_task()
    parallel, hp = wtc.train(task, TINY.replace(workers=2), progress=False)
    sequential, hs = wtc.train(task, TINY.replace(workers=1), progress=False)
    assert parallel.train_info == sequential.train_info
    for (k, a), (_, b) in zip(parallel.state_dict().items(), sequential.state_dict().items()):
        assert torch.equal(a, b), k
    assert hp.final["fresh"] == hs.final["fresh"]             # scored here, on fresh draws of the user's task
    assert parallel.train_info["score_on"] == "10000 fresh sequences"


def test_discover_a_callable_task_gives_one_program_for_any_number_of_workers():
    task = callable_task("user_sum2_d")
    cfg = DTConfig(steps=300, hard_steps=60, replicas=4, max_attempts=2)
    one = wtc.discover(task, config=cfg.replace(workers=1), budget_s=600, progress=False)
    two = wtc.discover(task, config=cfg.replace(workers=2), budget_s=600, progress=False)
    assert one.program is not None and two.program is not None
    assert one.program.source == two.program.source
    assert [a["label"] for a in one.attempts] == [a["label"] for a in two.attempts]
    assert one.attempts[0].get("verified_on") == JUDGED_ON    # the verdict is the user's callables'
    assert one.verification.n == 10000
    assert one.verification == two.verification


def test_a_pooled_reading_is_judged_the_same_in_the_job_and_in_the_caller(tmp_path):
    """A job holding the user's task (in-process, or forked: PoolTask.origin) judges its reading
    itself; one rebuilt from the pool file (a worker interpreter) leaves that to the caller, whose
    verdict is the same."""
    task = callable_task("user_sum2_j")
    jt = job_task(task, seed=0)
    assert jt.task.origin is task
    rung = Rung(0, "as configured", DTConfig(steps=300, hard_steps=60, replicas=4))
    here = DiscoverJob.run(jt.task, rung, 0, {"progress": False}, None)
    assert here.record["verified_on"] == JUDGED_ON and here.best.program is not None
    jt.pool.save(tmp_path / "pool.npz")
    rebuilt = pool.Pool.read(tmp_path / "pool.npz").task()
    assert rebuilt.origin is None
    there = DiscoverJob.run(rebuilt, rung, 0, {"progress": False}, None)
    assert "verified_on" not in there.record
    there = judged(there, task, 0)
    assert there.best.program.source == here.best.program.source
    assert there.best.verification == here.best.verification
    assert {k: v for k, v in there.record.items() if k != "seconds"} == \
        {k: v for k, v in here.record.items() if k != "seconds"}



class _Raising:
    """A read program that divides by zero on fresh data (as a replica's reading can)."""
    ok, n_lines, task = True, 3, "user_sum2_r"

    def __call__(self, x, **options):
        raise ZeroDivisionError("float division by zero")


def test_a_reading_whose_program_raises_on_fresh_data_is_a_failed_reading(monkeypatch):
    """A program that raises on the fresh sequences is not an error of discover: in the job the
    reading is reported in the record's errors and the next replica is read; the judge in the
    caller returns "not verified" and keeps the model, as unread. A target that is not a function
    of its inputs still raises (the task is at fault, not the reading)."""
    import wtc.discover_job as job
    from wtc.discover_job import Candidate, RungResult, read_replicas
    from wtc.extraction.verification import ProgramFailedError, VerificationError

    task = callable_task("user_sum2_r")
    run = Attempt(task, TINY.replace(replicas=3), 0, 0)
    scores = run_attempt(run)
    monkeypatch.setattr(job, "extract", lambda model, task, **kw: _Raising())
    record = {"attempt": 0, "replicas_read": 0, "verified": False}
    assert read_replicas(run, scores, record, 0, {}, time.perf_counter(), None, count=2) is None
    read = 2 if any(s["solved"] for s in scores) else job.UNSOLVED_REPLICAS_TO_READ
    assert len(record["errors"]) == read
    assert all("raised ZeroDivisionError" in e for e in record["errors"]) and not record["verified"]
    model, history = object(), object()
    result = judged(RungResult({"attempt": 0, "verified": True}, Candidate(_Raising(), model, history, None, (1,))),
                    task, 0)
    assert not result.verified and result.record["verified_on"] == JUDGED_ON
    assert "raised ZeroDivisionError" in result.record["errors"][-1]
    assert result.best.program is None and result.best.model is model
    drifting = wtc.Task("drifting", lambda rng, n: rng.integers(0, 5, (n, 6)),
                        lambda x: x + np.random.default_rng().integers(0, 2, x.shape), seq_len=6)
    with pytest.raises(VerificationError, match="not a function of its inputs") as err:
        judged(RungResult({"attempt": 0}, Candidate(lambda x, **kw: x, model, history, None, (1,))), drifting, 0)
    assert not isinstance(err.value, ProgramFailedError)


# ---------------------------------------------------------------------- the budget, stage by stage
def test_training_stops_at_the_deadline_and_the_polish_too():
    run = Attempt(wtc.tasks.get("prev2"), TINY, 0, 0)
    scores = run_attempt(run, deadline=long_ago())
    assert run.history.final["stopped_at_step"] == 1 and len(scores) == TINY.replicas
    assert run.phase == "done"


def test_polish_past_its_deadline_changes_nothing():
    run = Attempt(wtc.tasks.get("prev2"), TINY, 0, 0)
    run.model.freeze()
    x, y, valid = run.fit_data[:3]
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    polish(run.model, x[:64], y[:64], valid[:64], iters=50, until=time.time() - 1)
    for k, v in run.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_extract_past_its_deadline_raises_a_timeout():
    model, _ = wtc.train("sum_last2", DTConfig(steps=200, hard_steps=40, replicas=2, max_attempts=1, workers=1),
                         progress=False)
    with pytest.raises(ExtractionTimeout, match="time budget"):
        extract(model, "sum_last2", deadline=time.time() - 1)
    for bad in ("soon", float("nan"), True):
        with pytest.raises(ExtractionInputError, match="deadline"):
            extract(model, "sum_last2", deadline=bad)


def test_a_rung_cut_before_reading_keeps_its_model_and_says_so():
    task = wtc.tasks.get("prev2")
    result = DiscoverJob.run(task, Rung(0, "as configured", TINY), 0, {"deadline": long_ago().to_json()}, None)
    assert result.record["stopped_at_step"] == 1 and result.record["replicas_read"] == 0
    assert "budget ran out before replica" in result.record["cut"]
    assert result.best.program is None and result.best.model is not None and not result.verified
    d = Discovery(task, None, result.best.model, result.best.history, None, 1.0, [result.record], budget_s=5.0)
    assert any("training stopped at the budget at step 1" in n for n in d.budget_notes())
    assert "budget cut" in d.report()


def test_workers_past_the_last_resort_are_killed():
    task = wtc.tasks.get("prev2")
    ladder = Ladder(TINY.replace(steps=100000), workers=2, solved=lambda r: True, key=lambda r: None,
                    max_attempts=2)
    run_ladder("wtc.dt.attempt:TrainJob", job_task(task, 0), ladder, 0, {}, kill_at=time.time() + 3)
    assert ladder.results == {} and len(ladder.unfinished()) == 2    # both were killed (each trains for minutes)


def test_margin_is_five_percent_or_ten_seconds():
    assert margin_s(60) == 10.0 and margin_s(600) == 30.0


# ---------------------------------------------------------------------- one plan
def test_a_given_config_keeps_its_fields_and_the_probe_still_runs():
    w5 = dependence(wtc.Task("w5", lambda rng, n: rng.integers(0, 10, (n, 10)),
                             lambda x: sum(np.pad(x, ((0, 0), (d, 0)))[:, :10] for d in range(5)), seq_len=10))
    grown, why = sized_for(DTConfig(), w5)
    assert max(grown.n_heads) == 4
    kept, why = sized_for(DTConfig(n_heads=2), w5)        # set by hand: kept
    assert kept.n_heads == (2,) and why == ""
    d = wtc.discover("prev2", config=TINY.replace(max_attempts=1, workers=1), budget_s=60, progress=False)
    assert d.dependence is not None                        # a config no longer switches the probe off


# ---------------------------------------------------------------------- outputs checked before the work
def test_save_refuses_an_output_in_the_way_and_removes_stale_ones(tmp_path):
    (tmp_path / "model").write_text("not a directory")
    with pytest.raises(DiscoveryError, match="in the way"):
        Discovery.check_directory(tmp_path)
    out = tmp_path / "fresh"
    out.mkdir()
    (out / "program.py").write_text("stale")
    Discovery(wtc.tasks.get("prev2"), None, None, None, None, 0.0).save(out)
    assert not (out / "program.py").exists() and (out / "summary.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".wtc-save-")]


def test_cli_discover_checks_out_before_the_work(tmp_path):
    (tmp_path / "model").write_text("x")
    r = subprocess.run([sys.executable, "-m", "wtc", "discover", "prev2", "--out", str(tmp_path)],
                       capture_output=True, text=True, env={**os.environ, "WTC_DEBUG": ""})
    assert r.returncode == 2 and "in the way" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "summary.json").exists()


def test_real_valued_records_are_not_refused_for_float32_rounding():
    """Measurements with 17 significant digits round in float32 (two distinct values may become one):
    that is their precision, not a lost unit step, so the task is taken (integers past 2**24 are not)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (4000, 10))
    x[1, 0] = x[0, 0] + 1e-11                               # distinct in float64, equal in float32
    task = wtc.Task.from_arrays(x, x * 2, name="measured")
    assert task.output == "real"
    with pytest.raises(TaskError, match="float32"):
        wtc.Task.from_arrays(np.array([[2**30, 2**30 + 1]] * 60) + np.arange(60)[:, None] * 2**8,
                             np.zeros((60, 2)), name="big_ints")


def test_snap_past_its_deadline_snaps_nothing():
    from wtc.dt.snap import snap_heads
    run = Attempt(wtc.tasks.get("prev2"), TINY, 0, 0)
    run.model.freeze()
    x, y, valid = run.fit_data[:3]
    assert snap_heads(run.model, x[:64], y[:64], valid[:64], until=time.time() - 1) == []


def test_finishing_stops_half_way_between_training_and_the_end():
    d = Deadline.of(100.0, 1000.0, 0.25)
    assert (d.train_until, d.finish_by, d.end) == (1075.0, 1087.5, 1100.0)
