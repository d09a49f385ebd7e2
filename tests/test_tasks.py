import numpy as np
import pytest

import wtc
from wtc.tasks import TaskError


def test_registry_holds_the_whole_suite():
    must = ["parity_last2", "sum_last2", "prev2", "max_last3", "min_last2", "diff_prev", "product_last2",
            "first_value", "xor_pair", "and_prev", "select_by_flag", "ema3", "linear_combo", "nonlinear_combo",
            "relu_diff", "free_fall_height", "free_fall_next"]
    assert set(wtc.tasks.names(tier="must")) == set(must)
    assert set(wtc.tasks.names(tier="stretch")) == {"running_max", "running_sum", "count_ones", "running_mean"}
    for name in wtc.tasks.names():
        task = wtc.tasks.get(name)
        assert task.description, name
        x, y = task.batch(0, 7)
        assert x.shape == (7, task.seq_len, task.n_inputs)
        assert y.shape == (7, task.seq_len, task.n_outputs)
        assert np.all(np.isnan(y[:, :task.valid_from]))


@pytest.mark.parametrize("name,x,y", [
    ("parity_last2", [1, 1, 0, 1, 0, 0, 1, 1, 1, 0], [1, 0, 1, 1, 1, 0, 1, 0, 0, 1]),
    ("max_last3", [5, 1, 0, 9, 2, 2, 0, 0, 0, 7], [5, 5, 5, 9, 9, 9, 2, 2, 0, 7]),
    ("min_last2", [5, 1, 3, 9, 2, 2, 0, 4, 4, 7], [0, 1, 1, 3, 2, 2, 0, 0, 4, 4]),
    ("first_value", [4, 1, 3, 9, 2, 2, 0, 4, 4, 7], [4] * 10),
    ("diff_prev", [4, 1, 3, 9, 2, 2, 0, 4, 4, 7], [4, -3, 2, 6, -7, 0, -2, 4, 0, 3]),
])
def test_targets_by_hand(name, x, y):
    task = wtc.tasks.get(name)
    got = task.targets(np.array([x], dtype=float))[0, :, 0]
    np.testing.assert_array_equal(got, y)


def test_two_channel_targets():
    a = np.array([[1, 0, 1, 1, 0, 1, 0, 0, 1, 1]])
    b = np.array([[1, 1, 0, 1, 0, 0, 1, 0, 1, 0]])
    x = np.stack([a, b], -1).astype(float)
    np.testing.assert_array_equal(wtc.tasks.get("xor_pair").targets(x)[0, :, 0], a[0] ^ b[0])
    np.testing.assert_array_equal(wtc.tasks.get("and_prev").targets(x)[0, 1:, 0], a[0, 1:] & b[0, :-1])
    f = np.array([[1, 0, 0, 1, 1, 0, 1, 0, 0, 1]])
    v = np.arange(10)[None] * 7
    y = wtc.tasks.get("select_by_flag").targets(np.stack([f, v], -1).astype(float))[0, :, 0]
    np.testing.assert_array_equal(y, np.where(f[0] == 1, v[0], np.r_[0, v[0, :-1]]))


def test_free_fall_next_is_the_next_height():
    task = wtc.tasks.get("free_fall_next")
    x, y = task.batch(1, 50)
    np.testing.assert_allclose(y[:, 1:-1, 0], x[:, 2:, 0], rtol=1e-12, atol=1e-9)


def test_user_task_and_scoring():
    task = wtc.Task("copy", lambda rng, n: rng.integers(0, 5, (n, 4)), lambda x: x, seq_len=4)
    x, y = task.batch(3, 20)
    assert task.score(y[..., 0], y)["accuracy"] == 1.0
    assert task.score(y[..., 0] + 0.6, y)["accuracy"] == 0.0
    real = wtc.Task("half", lambda rng, n: rng.uniform(size=(n, 4)), lambda x: x / 2, seq_len=4, output="real")
    x, y = real.batch(0, 5)
    assert real.score(y * (1 + 5e-4), y)["solved"] and not real.score(y + 0.01, y)["solved"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(seq_len=0), "seq_len"),
    (dict(seq_len=4, output="complex"), "output"),
    (dict(seq_len=4, valid_from=4), "valid_from"),
    (dict(seq_len=4, n_inputs=-1), "n_inputs"),
])
def test_bad_task_definitions(kwargs, message):
    with pytest.raises(TaskError, match=message):
        wtc.Task("bad", lambda rng, n: rng.uniform(size=(n, 4)), lambda x: x, **kwargs)


def test_bad_callables_are_named():
    ok = lambda rng, n: rng.uniform(size=(n, 4))  # noqa: E731
    with pytest.raises(TaskError, match="'t1'.*shape"):
        wtc.Task("t1", lambda rng, n: rng.uniform(size=(n, 5)), lambda x: x, seq_len=4).batch(0, 3)
    with pytest.raises(TaskError, match="'t2'.*NaN"):
        wtc.Task("t2", lambda rng, n: np.full((n, 4), np.nan), lambda x: x, seq_len=4).batch(0, 3)
    with pytest.raises(TaskError, match="'t3'.*target.*NaN or inf"):
        wtc.Task("t3", ok, lambda x: x / 0 * 0, seq_len=4, output="real").batch(0, 3)
    with pytest.raises(TaskError, match="'t4'.*raised ZeroDivisionError"):
        wtc.Task("t4", ok, lambda x: 1 / 0, seq_len=4).batch(0, 3)
    with pytest.raises(TaskError, match="'t5'.*non-integer"):
        wtc.Task("t5", ok, lambda x: x, seq_len=4).batch(0, 3)
    with pytest.raises(TaskError, match="'t6'.*target has shape"):
        wtc.Task("t6", ok, lambda x: x[:, :2], seq_len=4, output="real").batch(0, 3)
    with pytest.raises(TaskError, match="'t7'.*returned 2 sequences"):
        wtc.Task("t7", lambda rng, n: rng.uniform(size=(2, 4)), lambda x: x, seq_len=4).batch(0, 3)
    # NaN before valid_from is allowed: those positions are undefined
    task = wtc.Task("t8", ok, lambda x: np.where(np.arange(4) < 1, np.nan, x), seq_len=4, output="real", valid_from=1)
    assert task.batch(0, 3)[1].shape == (3, 4, 1)


def test_unknown_task_suggests():
    with pytest.raises(TaskError, match="did you mean parity_last2"):
        wtc.tasks.get("parity_last")


def test_public_functions_survive_submodule_imports():
    """`import wtc.discovery` / `import wtc.extraction` must not shadow wtc.discover / wtc.extract."""
    import subprocess
    import sys
    code = ("import wtc.discovery, wtc.extraction, wtc; "
            "assert callable(wtc.discover) and callable(wtc.extract), (wtc.discover, wtc.extract); "
            "from wtc.extraction import verify; assert callable(verify)")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- beyond the training length
def test_any_length_tasks_extend_with_the_same_target():
    import numpy as np

    from wtc.tasks import builtin

    task = wtc.tasks.get("sum_last2")
    assert task.any_length and not wtc.tasks.get("free_fall_next").any_length    # a trajectory: one length
    long = task.at_length(25)
    x, y = long.batch(np.random.default_rng(0), 32)
    assert x.shape == (32, 25, 1) and long.seq_len == 25 and long.name == "sum_last2 (T=25)"
    np.testing.assert_array_equal(y[:, :, 0], x[:, :, 0] + np.concatenate([np.zeros((32, 1)), x[:, :-1, 0]], 1))
    for name in builtin.SUITE:                        # every extendable built-in: causal targets agree on the prefix
        t = builtin.make(name)
        if t.any_length:
            xl, yl = t.at_length(2 * t.seq_len).batch(np.random.default_rng(1), 16)
            xb = xl[:, :t.seq_len]
            yb = t.targets(xb[..., 0] if t.n_inputs == 1 and t._sample_ndim() == 2 else xb)
            np.testing.assert_array_equal(np.nan_to_num(yl[:, :t.seq_len], nan=-7), np.nan_to_num(yb, nan=-7))


def test_at_length_refusals():
    import numpy as np

    fixed = wtc.Task("fixed", lambda rng, n: rng.integers(0, 9, (n, 6)), lambda x: x, seq_len=6)
    with pytest.raises(TaskError, match="seq_len=6 only"):
        fixed.at_length(12)
    with pytest.raises(TaskError, match="any_length must be True or False"):
        wtc.Task("t", lambda rng, n: np.zeros((n, 4)), lambda x: x, seq_len=4, any_length="yes")
    with pytest.raises(TaskError, match="length > valid_from"):
        wtc.tasks.get("ema3").at_length(2)
