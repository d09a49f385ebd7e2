"""Tasks from recorded data (Task.from_arrays): the split, the lookup, the refusals, and a
discovery whose verification runs on the held-out sequences only."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import wtc
from wtc.tasks import Task, TaskError


def recorded(n=200, T=8, seed=0):
    x = np.random.default_rng(seed).integers(0, 20, (n, T)).astype(float)
    y = x + np.concatenate([np.zeros((n, 1)), x[:, :-1]], axis=1)      # x_t + x_{t-1}
    return x, y


def test_split_is_seeded_disjoint_and_complete():
    x, y = recorded()
    a, b = Task.from_arrays(x, y, name="s", seed=3), Task.from_arrays(x, y, name="s", seed=3)
    assert a.size == 160 and a.heldout.size == 40 and a.output == "integer" and a.seq_len == 8
    rows = lambda t: {r.tobytes() for r in t.sample(np.random.default_rng(0), t.size)}   # noqa: E731
    train, held = rows(a), rows(a.heldout)
    assert len(train) + len(held) == len({r.tobytes() for r in x}) and not train & held
    assert rows(b) == train
    assert rows(Task.from_arrays(x, y, name="s", seed=4)) != train


def test_targets_are_the_recorded_outputs():
    x, y = recorded()
    task = Task.from_arrays(x, y)
    xs, ys = task.batch(np.random.default_rng(1), 50)
    want = {r.tobytes(): o for r, o in zip(x, y)}
    for r, o in zip(xs[..., 0], ys[..., 0]):
        np.testing.assert_array_equal(o, want[r.tobytes()])
    with pytest.raises(TaskError, match="known only for recorded sequences"):
        task.targets(xs + 0.5)


def test_verification_uses_the_heldout_part_only():
    x, y = recorded()
    task = Task.from_arrays(x, y, name="sum2")
    on, n = task.verification(10000)
    assert on is task.heldout and n == 40
    def program(s):                                # verify passes (n, T, k)
        s = s[..., 0]
        return s + np.concatenate([np.zeros((len(s), 1)), s[:, :-1]], axis=1)

    exact = wtc.extraction.verify(program, task)
    assert exact.solved and exact.n == 40
    wrong = wtc.extraction.verify(lambda s: 2 * s[..., 0], task)
    assert not wrong.solved


def test_multichannel_and_real_outputs():
    rng = np.random.default_rng(0)
    x = rng.random((100, 6, 2))
    y = x[..., 0] * x[..., 1]
    task = Task.from_arrays(x, y, name="prod", valid_from=1)
    assert task.output == "real" and task.n_inputs == 2 and task.valid_from == 1
    xs, ys = task.batch(rng, 10)
    assert xs.shape == (10, 6, 2) and np.isnan(ys[:, 0]).all()


@pytest.mark.parametrize("kw, match", [
    ({"inputs": np.zeros((10, 4)), "outputs": np.zeros((10, 4))}, "too few to train on and verify"),
    ({"outputs": np.zeros((200, 7))}, "must agree in"),
    ({"inputs": np.zeros(5)}, r"\(n, T\) or \(n, T, k\)"),
    ({"heldout": 0}, "heldout must be a share"),
    ({"heldout": 1.5}, "heldout must be a share"),
    ({"seed": -1}, "seed"),
    ({"valid_from": 8}, "valid_from"),
    ({"inputs": np.full((200, 8), np.nan)}, "inputs hold NaN"),
    ({"inputs": np.zeros((200, 8)) + 1j}, "complex"),
])
def test_bad_recordings_are_refused(kw, match):
    x, y = recorded()
    args = {"inputs": x, "outputs": y, **kw}
    with pytest.raises(TaskError, match=match):
        Task.from_arrays(args.pop("inputs"), args.pop("outputs"), **args)


def test_an_input_recorded_with_two_outputs_is_refused():
    x, y = recorded()
    x[5], y[5] = x[4], y[4] + 1
    with pytest.raises(TaskError, match=r"sequence 5 repeats an earlier input \(sequence 4\) with other outputs"):
        Task.from_arrays(x, y)


def test_outputs_may_be_undefined_before_valid_from():
    x, y = recorded()
    y[:, 0] = np.nan
    with pytest.raises(TaskError, match="NaN or inf at a valid position"):
        Task.from_arrays(x, y)
    assert Task.from_arrays(x, y, valid_from=1).valid_from == 1


@pytest.mark.slow
def test_discover_reads_a_program_from_recorded_data():
    x, y = recorded(n=400, T=10)
    d = wtc.discover(Task.from_arrays(x, y, name="recorded_sum"), progress=False, budget_s=300,
                     config=wtc.DTConfig(steps=700, replicas=6))
    assert d.solved and d.verification.n == 80
    ns: dict = {}
    exec(d.program.source, ns)                     # the emitted source, run as a user would
    held = d.task.heldout
    xs, ys = held.batch(np.random.default_rng(0), held.size)
    for seq, want in zip(xs[..., 0], ys[..., 0]):
        assert ns["program"](list(seq)) == list(want)


def test_duplicated_records_are_one_sequence():
    """100 copies of 10 sequences are 10 sequences: too few, and never split across train / held out."""
    x, y = recorded(n=10)
    with pytest.raises(TaskError, match="10 distinct recorded sequences are too few"):
        Task.from_arrays(np.vstack([x] * 10), np.vstack([y] * 10))
    x, y = recorded(n=120)
    task = Task.from_arrays(np.vstack([x, x]), np.vstack([y, y]))
    assert task.size + task.heldout.size == 120
    rows = lambda t: {r.tobytes() for r in t.sample(np.random.default_rng(0), t.size)}   # noqa: E731
    assert not rows(task) & rows(task.heldout)


def test_huge_whole_numbers_are_real_data():
    u = np.random.default_rng(0).uniform(size=(100, 4))
    assert Task.from_arrays(u * 1e20, u * 1e25).output == "real"        # every float64 past 2**53 is whole
    with pytest.raises(TaskError, match="rescale"):
        Task.from_arrays(u * 1e200, u)
    with pytest.raises(TaskError, match="not whole numbers"):
        Task.from_arrays(u, u + 0.5, output="integer")


def test_train_on_data_reports_the_heldout_score():
    """wtc.train scored a data task on its training records (solved, while held out it was wrong)."""
    x, y = recorded(n=100)
    task = Task.from_arrays(x, y)
    held = {r.tobytes() for r in task.heldout.sample(np.random.default_rng(0), task.heldout.size)[..., None]
            .reshape(task.heldout.size, -1)}
    y2 = y.copy()
    for k in range(len(x)):                                    # the held-out records say something else
        if x[k].tobytes() in held:
            y2[k] = y[k] + 7
    model, history = wtc.train(Task.from_arrays(x, y2), wtc.DTConfig(steps=200, replicas=2, max_attempts=1),
                               progress=False)
    assert model.train_info["score_on"] == "20 held-out sequences" and history.final["heldout"]["accuracy"] < 0.5
    assert not model.train_info["score"]["solved"]


def test_records_rebuild_the_same_task(tmp_path):
    """What a worker process trains on: the task rebuilt from its saved records has the same split,
    targets and fingerprint (a worker's result is checked against it)."""
    from wtc.tasks import data

    x, y = recorded(n=120)
    x[5] = x[3]
    y[5] = y[3]                                  # a duplicated record
    task = Task.from_arrays(x, y, name="rec", heldout=0.3, seed=4, description="d")
    data.save_records(task, tmp_path / "r.npz")
    inputs, outputs, options = data.read_records(tmp_path / "r.npz")
    back = Task.from_arrays(inputs, outputs, **options)
    assert back.fingerprint() == task.fingerprint() and (back.size, back.heldout.size) == (task.size, task.heldout.size)
    rng = np.random.default_rng(1)
    xs = task.heldout.sample(rng, task.heldout.size)
    np.testing.assert_array_equal(back.heldout.targets(xs), task.heldout.targets(xs))
    assert back.description == "d" and not data.has_records(wtc.tasks.get("prev2"))


def test_data_task_rungs_run_in_workers_with_the_sequential_result():
    """A data task's rungs go to worker processes (both cores busy) and give the model that
    training them one after another in this process gives."""
    from wtc.dt.workers import RECORDS, job_task

    x, y = recorded(n=100)
    task = Task.from_arrays(x, y)
    assert job_task(task, 0).ref == RECORDS
    cfg = wtc.DTConfig(n_heads=1, n_mlps=1, mlp_hidden=8, steps=30, hard_steps=5, polish_iters=5, replicas=2,
                       max_attempts=2, batch_size=16, eval_sequences=64, precision_iters=0)
    parallel, _ = wtc.train(task, cfg.replace(workers=2), progress=False)
    sequential, _ = wtc.train(task, cfg.replace(workers=1), progress=False)
    assert parallel.train_info == sequential.train_info
    for (k, a), (_, b) in zip(parallel.state_dict().items(), sequential.state_dict().items()):
        assert torch.equal(a, b), k
