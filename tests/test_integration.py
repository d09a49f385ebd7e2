"""Integration: Discrete Transformers trained from scratch, and whole discover runs (slow; CI runs them).

Training is deterministic for a seed, so these are fixed experiments, not lottery tickets; each
uses a configuration sized for CI (fewer steps and replicas than the defaults)."""
import numpy as np
import pytest
import sympy as sp

import wtc
from wtc.dt import DTConfig

pytestmark = pytest.mark.slow

CI = dict(steps=700, replicas=6, max_attempts=2, workers=1)   # sequential: same result, no idle second attempt


def fresh_score(model, name, seed=12345):
    task = wtc.tasks.get(name)
    x, y = task.batch(np.random.default_rng(seed), 5000)
    return task.score(model.predict(x), y)


def test_dt_reaches_full_accuracy_on_max_last3():
    """A windowed max of three: rung 0's content heads learn the argmax over the last three
    positions only fuzzily (agreement 0.88-0.92, seed 0), which a one-hidden-layer sub-MLP of two
    inputs cannot repair; snapping (wtc.dt.snap) sets such a head to the exact rule and the first
    rung solves it (before snapping, the ladder's rung 1 did, with 3-input sub-MLPs and the float64
    pass). Default config, sequential attempts."""
    model, _ = wtc.train("max_last3", DTConfig(workers=1), seed=0, progress=False)
    assert model.train_info["attempt"] == 0
    assert any(s["rule"].startswith("argmax of x over the last 3 positions") for s in model.train_info["snaps"])
    assert fresh_score(model, "max_last3")["accuracy"] == 1.0


@pytest.mark.parametrize("name", ["parity_last2", "sum_last2", "prev2"])
def test_dt_reaches_full_accuracy(name):
    model, history = wtc.train(name, DTConfig(**CI), seed=0, progress=False)
    assert fresh_score(model, name)["accuracy"] == 1.0
    # functional convergence comes before structural discretization: the loss has fallen by half
    # while the selections are still far from one-hot
    c = history.curves()
    half = np.argmax(c["loss"] < 0.5 * c["loss"][0])
    assert c["sel_entropy"][half].mean() > 0.5 * c["sel_entropy"][0].mean()


@pytest.mark.parametrize("name", ["linear_combo", "ema3"])
def test_dt_reaches_real_precision(name):
    model, _ = wtc.train(name, DTConfig(**CI), seed=0, progress=False)
    assert fresh_score(model, name)["max_rel_err"] <= 1e-3


def test_discover_parity_finds_the_papers_expression(tmp_path):
    d = wtc.discover("parity_last2", seed=0, budget_s=240, progress=False,
                     config=DTConfig(steps=700, replicas=6))
    assert d.solved and d.verification.accuracy == 1.0
    x, p = sp.symbols("x prev1_x")
    assert sp.simplify(d.program.outputs[0] - (x + p - 2 * x * p)) == 0
    d.save(tmp_path)
    for f in ("program.py", "report.md", "summary.json", "training.svg", "model/model.safetensors"):
        assert (tmp_path / f).exists(), f
    namespace: dict = {}
    exec((tmp_path / "program.py").read_text(), namespace)
    assert namespace["program"]([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]) == [1, 1, 0, 1, 0, 0, 1, 1, 1, 0]


def test_discover_user_task_not_in_registry():
    """A task defined by a user: y_t = 3 x_{t-1} - x_t on small integers."""
    task = wtc.Task("user_shift_combo", lambda rng, n: rng.integers(0, 20, (n, 8)),
                    lambda x: 3 * np.concatenate([np.zeros((len(x), 1)), x[:, :-1]], 1) - x, seq_len=8)
    d = wtc.discover(task, seed=0, budget_s=240, progress=False, config=DTConfig(steps=700, replicas=6))
    assert d.solved, d.summary()
    x, p = sp.symbols("x prev1_x")
    assert sp.simplify(d.program.outputs[0] - (3 * p - x)) == 0


def test_discover_a_position_under_forces_declared_with_lambdas(tmp_path):
    """The prefix sum of the prefix sum (a unit mass under forces x_t): the probe's second-order step
    starts it with sum heads in two layers, so the first attempt verifies; the saved program.py,
    exec'd in a fresh namespace, is right on fresh forces at the training length and at twice it."""
    task = wtc.Task("position_under_forces", lambda rng, n: rng.integers(-10, 11, (n, 10)),
                    lambda x: np.cumsum(np.cumsum(x, 1), 1), seq_len=10, any_length=True)
    d = wtc.discover(task, seed=0, budget_s=240, progress=False)
    assert d.solved and len(d.summary()["attempts"]) == 1, d.summary()["attempts"]
    d.save(tmp_path)
    namespace: dict = {}
    exec(compile((tmp_path / "program.py").read_text(), "program.py", "exec"), namespace)
    rng = np.random.default_rng(99)
    for T in (10, 20):
        for xs in rng.integers(-10, 11, (50, T)):
            assert namespace["program"](xs.tolist()) == np.cumsum(np.cumsum(xs)).tolist()
