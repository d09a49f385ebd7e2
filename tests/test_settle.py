"""Settling early (wtc.dt.settle): discover's attempts end the annealing once a
replica's argmax model is right everywhere on the settle check (as trained, or with its head refit
by least squares, its heads snapped, its sub-MLPs polished); the finish starts from the model the
check found exact."""
import numpy as np
import torch

import wtc
from wtc.tasks.task import shift
from wtc.dt import DTConfig
from wtc.dt.attempt import Attempt, run_attempt
from wtc.dt.settle import (POLISH_CHECK_ITERS, POLISH_CHECK_STEPS, SETTLE_EVERY, SETTLE_FROM, SETTLE_SEQUENCES,
                           SNAP_CHECK_STEPS, exact_by)
from wtc.dt.finish import least_squares_head
from wtc.dt.selection import EVAL

SMALL = DTConfig(n_heads=1, n_mlps=1, mlp_hidden=8, steps=600, hard_steps=10, polish_iters=5, replicas=4,
                 batch_size=32, eval_sequences=128, precision_iters=0, workers=1)


def flip_task():
    """y_t = 1 - x_t over bits, declared as a user would: exact within a few hundred steps."""
    return wtc.Task("flip", sample=lambda rng, n: rng.integers(0, 2, size=(n, 6)), target=lambda x: 1 - x,
                    seq_len=6)


def table_task():
    """y_t a fixed random table of (x_{t-1}, x_t) over [0, 12): nothing is exact in 150 steps."""
    table = np.random.default_rng(5).integers(0, 12, size=(12, 12))
    return wtc.Task("table", sample=lambda rng, n: rng.integers(0, 12, size=(n, 6)),
                    target=lambda x: table[shift(x, 1), x], seq_len=6)


def test_a_settled_attempt_finishes_from_the_exact_check():
    """No hard phase after settling: the finish starts from the step that was exact, whose argmax
    model the check read; the history ends at that step."""
    run = Attempt(flip_task(), SMALL, seed=0, attempt=0, settle=True)
    scores = run_attempt(run)
    settled = run.history.final["settled_at_step"]
    assert SETTLE_FROM <= settled < SMALL.steps and settled % SETTLE_EVERY == 0
    assert run.hard_from == settled == run.step == run.planned_steps and run.phase == "done"
    assert run.history.step[-1] == settled - 1 and set(run.history.phase) == {"anneal"}
    assert any(s["solved"] for s in scores)


def test_an_unsettled_attempt_runs_its_whole_schedule():
    cfg = SMALL.replace(steps=SETTLE_FROM - 1, hard_steps=2 * SETTLE_EVERY)   # no settle check
    run = Attempt(flip_task(), cfg, seed=0, attempt=0, settle=True)
    run_attempt(run)
    assert run.step == cfg.steps + cfg.hard_steps == run.planned_steps and "settled_at_step" not in run.history.final


def _exact_by_hand(run) -> bool:
    """The settle check computed another way: the argmax model's predictions, and its final stream
    (DiscreteTransformer.final_stream) with a least-squares head fit on half the check's sequences
    and rounded on the other half."""
    x, y, valid, y_raw = (t[:SETTLE_SEQUENCES] for t in run.fit_data)
    half = SETTLE_SEQUENCES // 2
    with torch.no_grad():
        pred, _ = run.model(x, EVAL)
        if (run._batch_metric(pred, y_raw, valid) >= 1.0).any():
            return True
        body = run.model.final_stream(x)[:, :, run.model.P:].double()
        W, b, _ = least_squares_head(body[:, :half], y[:half], valid[:half])
        refit = torch.stack([body[r, half:] @ W[r] + b[r] for r in range(body.shape[0])]).float()
    return bool((run._batch_metric(refit, y_raw[half:], valid[half:]) >= 1.0).any())


def test_the_settle_check_reads_the_argmax_model():
    run = Attempt(flip_task(), SMALL, seed=0, attempt=0, settle=True)
    while run.phase == "anneal":
        run.train_step()
    assert run.hard_from < SMALL.steps and _exact_by_hand(run)   # the model at the settle step


def test_the_settle_check_refits_the_head():
    """A replica whose routing is right but whose trained head is off settles (its head is refit at
    the finish); a population whose stream does not hold the answer does not."""
    run = Attempt(flip_task(), SMALL, seed=0, attempt=0, settle=True)
    while run.phase == "anneal":
        run.train_step()
    with torch.no_grad():
        run.model.W_out.mul_(1.7)
        run.model.b_out.add_(0.9)
        x, _, valid, y_raw = (t[:SETTLE_SEQUENCES] for t in run.fit_data)
        pred, _ = run.model(x, EVAL)
    assert not (run._batch_metric(pred, y_raw, valid) >= 1.0).any()     # the heads as they are: wrong
    assert run._exact() and _exact_by_hand(run)
    fresh = Attempt(table_task(), SMALL, seed=0, attempt=0, settle=True)
    assert not fresh._exact() and not _exact_by_hand(fresh)


def test_without_settle_the_whole_schedule_runs():
    run = Attempt(flip_task(), SMALL.replace(steps=200), seed=0, attempt=0, settle=False)
    run_attempt(run)
    assert run.step == 200 + SMALL.hard_steps and "settled_at_step" not in run.history.final


def test_the_check_changes_nothing_until_it_settles():
    """The check draws no randomness: an attempt that has not settled is step for step the one
    without checks (parameters equal after several checks)."""
    task, steps = table_task(), SETTLE_FROM + 2 * SETTLE_EVERY
    runs = [Attempt(task, SMALL, seed=1, attempt=0, settle=s) for s in (True, False)]
    for run in runs:
        for _ in range(steps):
            run.train_step()
    assert runs[0].phase == "anneal"
    for (name, a), b in zip(runs[0].model.state_dict().items(), runs[1].model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_real_valued_task_settles_within_its_tolerance():
    """y_t = 0.5 x_t + 0.25 x_{t-1} over reals: the head refit meets the solved criterion
    (REAL_TOLERANCE) early; the attempt settles and is solved on fresh data. A product of the two,
    which a population without sub-MLPs cannot compute, is not within the tolerance."""
    def real_task(name, target):
        return wtc.Task(name, sample=lambda rng, n: rng.uniform(0, 1, size=(n, 6)), target=target, seq_len=6,
                        output="real")

    cfg = SMALL.replace(n_heads=1, n_mlps=0)
    product = Attempt(real_task("product", lambda x: x * shift(x, 1)), cfg, seed=0, attempt=0, settle=True)
    assert exact_by(product.model, product.fit_data, snap=True, real=True) is None
    run = Attempt(real_task("half", lambda x: 0.5 * x + 0.25 * shift(x, 1)), cfg, seed=0, attempt=0, settle=True)
    scores = run_attempt(run)
    assert run.settled_by in ("as trained", "head refit") and run.hard_from < SMALL.steps
    assert any(s["solved"] for s in scores)


def test_a_settled_state_resumes_where_it_was(tmp_path):
    """A state saved once the check settled resumes at the finish: the same step, phase and settle
    record, and the same finished model and scores."""
    run = Attempt(flip_task(), SMALL, seed=0, attempt=0, settle=True)
    while run.phase == "anneal":
        run.train_step()
    run.save(tmp_path / "state.safetensors")
    again = Attempt(flip_task(), SMALL, seed=0, attempt=0, settle=True)
    again.restore(tmp_path / "state.safetensors")
    assert (again.step, again.phase, again.hard_from) == (run.step, "finish", run.hard_from) and run.hard_from < SMALL.steps
    assert again.settled_by == run.settled_by is not None
    assert run_attempt(run) == run_attempt(again)
    for a, b in zip(run.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)


def window_max_task():
    """y_t = max(x_{t-2}, x_{t-1}, x_t) over ints in [0, 100): its content head follows the window
    rule on most queries long before it is exact on all of them."""
    def target(x):
        return np.stack([x[:, max(0, t - 2): t + 1].max(axis=1) for t in range(x.shape[1])], axis=1)
    return wtc.Task("max3", sample=lambda rng, n: rng.integers(0, 100, size=(n, 8)), target=target, seq_len=8)


WINDOW_CFG = DTConfig(n_heads=2, n_mlps=1, replicas=4, workers=1, hard_steps=150, eval_sequences=256,
                      precision_iters=0)


def test_a_window_maximum_settles_once_its_snapped_heads_are_exact():
    """The as-trained and head-refit checks fail where the snapped one succeeds; the check works on
    a copy (the model in training is unchanged), and the attempt that settled so is solved."""
    run = Attempt(window_max_task(), WINDOW_CFG, seed=0, attempt=0, settle=True)
    while run.phase == "anneal":
        run.train_step()
    assert run.settled_by == "heads snapped" and run.hard_from in SNAP_CHECK_STEPS
    assert exact_by(run.model, run.fit_data, snap=False) is None
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    assert exact_by(run.model, run.fit_data, snap=True) == "heads snapped"
    for k, v in run.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    scores = run_attempt(run)
    assert any(s["solved"] for s in scores) and run.history.final["settled_by"] == "heads snapped"


def test_the_snapped_check_runs_only_at_its_steps(monkeypatch):
    """Between SNAP_CHECK_STEPS the anneal's checks do not snap: an attempt whose snapped check is
    made to fail never settles, and the snapped check ran exactly at the scheduled steps, on the
    closest replicas, and on every replica at the polished check's steps."""
    from wtc.dt import settle
    asked = []
    monkeypatch.setattr(settle, "_finished_exact",
                        lambda model, replicas, *a: asked.append(len(replicas)) or settle.Check(None))
    run = Attempt(window_max_task(), WINDOW_CFG.replace(steps=450), seed=0, attempt=0, settle=True)
    steps = []
    while run.phase == "anneal":
        run.train_step()
        if run.step % SETTLE_EVERY == 0 and len(asked) > len(steps):
            steps.append(run.step)
    assert steps == [s for s in sorted(SNAP_CHECK_STEPS) if SETTLE_FROM <= s < 450]
    R = WINDOW_CFG.replicas
    assert asked == [R if s in POLISH_CHECK_STEPS else settle.SNAP_CHECK_REPLICAS for s in steps]
    assert R > settle.SNAP_CHECK_REPLICAS and run.hard_from == 450


def test_the_polished_check_finishes_a_copy_of_the_closest_replicas():
    """min(x_{t-1}, x_t) needs a precise sub-MLP: at step 400 a copy of the replicas, snapped, the
    closest then polished (up to POLISH_CHECK_ITERS of L-BFGS), is exact (on the Xeon of session 28,
    where the cheaper checks are not); the population in training is untouched."""
    task = wtc.Task("min2", sample=lambda rng, n: rng.integers(0, 20, size=(n, 6)),
                    target=lambda x: np.minimum(x, shift(x, 1)), seq_len=6)
    cfg = DTConfig(n_heads=2, n_mlps=1, replicas=4, workers=1, mlp_inputs=2, mlp_hidden=16)
    run = Attempt(task, cfg, seed=0, attempt=0, settle=False)
    for _ in range(400):
        run.train_step()
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    cheaper = exact_by(run.model, run.fit_data, snap=True)
    polished = exact_by(run.model, run.fit_data, snap=True, polish_iters=POLISH_CHECK_ITERS)
    assert polished is not None and (cheaper is not None or polished == "sub-MLPs polished")
    for k, v in run.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def _product_task():
    return wtc.Task("product", sample=lambda rng, n: rng.uniform(0, 1, size=(n, 6)), target=lambda x: x * shift(x, 1),
                    seq_len=6, output="real")


def test_a_close_check_ends_the_annealing_and_keeps_the_attempt_to_train_on(monkeypatch):
    """read_close: a polished check that finds a replica within CLOSE_FOR_READING (here made wide
    enough for any) ends the annealing (settled_by CLOSE_READ), once; resume_from is the attempt as
    it stood at the check, and trained on from there it is step for step the attempt without checks."""
    from wtc.dt import attempt as attempt_module, settle
    monkeypatch.setattr(settle, "CLOSE_FOR_READING", float("inf"))
    task, cfg = _product_task(), SMALL.replace(steps=300)
    run = Attempt(task, cfg, seed=0, attempt=0, settle=True, read_close=True)
    scores = run_attempt(run)
    first = min(POLISH_CHECK_STEPS)
    assert run.settled_by == attempt_module.CLOSE_READ and run.history.final["settled_at_step"] == first
    assert run.phase == "done" and len(scores) == cfg.replicas
    resumed = run.resume_from
    assert resumed.step == first and resumed.phase == "anneal" and resumed.resume_from is None
    assert resumed.read_checks_left == attempt_module.READ_CHECKS - 1 == 0 and resumed.settled_by is None
    plain = Attempt(task, cfg, seed=0, attempt=0, settle=True)     # checks, none of them close checks
    for _ in range(first):
        plain.train_step()
    for _ in range(60):
        plain.train_step()
        resumed.train_step()
    for (name, a), b in zip(resumed.model.state_dict().items(), plain.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.history.step == plain.history.step and plain.phase == resumed.phase == "anneal"


def test_a_close_check_is_for_real_outputs_and_discover_only(monkeypatch):
    """An integer task is exact or not: no close check. Without read_close (wtc.train) none either."""
    from wtc.dt import settle
    assert settle.Check(None, -0.01).worth_reading(real=True)
    assert not settle.Check(None, -0.01).worth_reading(real=False)
    assert not settle.Check(None, -2 * settle.CLOSE_FOR_READING).worth_reading(real=True)
    assert not settle.Check(None, None).worth_reading(real=True)
    assert not settle.Check("head refit", -0.0).worth_reading(real=True)
    monkeypatch.setattr(settle, "CLOSE_FOR_READING", float("inf"))
    run = Attempt(_product_task(), SMALL.replace(steps=250), seed=0, attempt=0, settle=True)
    run_attempt(run)
    assert run.resume_from is None and run.settled_by is None


def test_discover_trains_on_when_the_close_check_reading_fails(monkeypatch):
    """A rung that ended at a close check reads its best replica; when that reading fails, the
    attempt trains on from the check to its whole schedule and is read again as usual."""
    from wtc import discover_job
    from wtc.dt import settle
    from wtc.dt.ladder import Rung
    from wtc.extraction.formulas import ExtractionError
    monkeypatch.setattr(settle, "CLOSE_FOR_READING", float("inf"))
    real_extract, calls = discover_job.extract, []

    def extract_failing_first(model, task, **kw):
        calls.append(model)
        if len(calls) == 1:
            raise ExtractionError("made to fail")
        return real_extract(model, task, **kw)
    monkeypatch.setattr(discover_job, "extract", extract_failing_first)
    cfg = SMALL.replace(steps=260, hard_steps=20)
    result = discover_job.DiscoverJob.run(_product_task(), Rung(0, "as configured", cfg), 0, {}, None)
    record = result.record
    assert record["read_at_step"] == min(POLISH_CHECK_STEPS) and "settled_by" not in record
    assert len(record["errors"]) == 1 and record["errors"][0].endswith(": made to fail")
    assert len(calls) >= 2 and record["replicas_read"] == len(calls) - 1
    assert result.best.history.step[-1] == cfg.steps + cfg.hard_steps - 1    # trained to the end
