"""wtc.tasks.probe: what a task's target reads, from the target as a black box; and how discover
sizes its first architecture from it."""
from __future__ import annotations

import json

import numpy as np
import pytest

import wtc
from wtc.discovery import sized_for
from wtc.dt import DTConfig
from wtc.tasks import Task
from wtc.tasks.probe import dependence


def lag(x, d):
    return np.concatenate([np.zeros((len(x), d)), x[:, :-d]], 1) if d else x


def ints(T=10, hi=10):
    return lambda rng, n: rng.integers(0, hi, (n, T))


@pytest.mark.parametrize("name, offsets, absolute, prefix", [
    ("prev2", [[2]], [[]], [False]),
    ("max_last3", [[0, 1, 2]], [[]], [False]),
    ("first_value", [[]], [[0]], [False]),
    ("and_prev", [[0], [1]], [[], []], [False, False]),
    ("select_by_flag", [[0], [0, 1]], [[], []], [False, False]),
    ("running_sum", [[0]], [[]], [True]),
    ("count_ones", [[0]], [[]], [True]),
    ("free_fall_height", [[0]], [[]], [False]),
])
def test_builtins_read_what_their_definitions_say(name, offsets, absolute, prefix):
    d = dependence(wtc.tasks.get(name))
    assert (d.offsets, d.absolute, d.prefix) == (offsets, absolute, prefix), d.describe()


def test_windows_and_prefixes_of_user_tasks():
    w5 = dependence(Task("w5", ints(), lambda x: sum(lag(x, d) for d in range(5)), seq_len=10))
    assert w5.offsets == [[0, 1, 2, 3, 4]] and not w5.prefix[0] and w5.pointer_routes == 4
    w7 = dependence(Task("w7", ints(12), lambda x: np.max([lag(x, d) for d in range(7)], 0), seq_len=12))
    assert w7.offsets == [[0, 1, 2, 3, 4, 5, 6]] and w7.pointer_routes == 6
    cm = dependence(Task("cm3", ints(10, 3), lambda x: np.cumsum(x, 1) % 3, seq_len=10))
    assert cm.prefix == [True] and cm.pointer_routes == 0
    const = dependence(Task("c", ints(), lambda x: np.zeros_like(x), seq_len=10))
    assert const.offsets == [[]] and const.describe() == "no position of x"


def test_data_tasks_are_not_probed():
    x = np.random.default_rng(0).integers(0, 9, (100, 6)).astype(float)
    assert dependence(Task.from_arrays(x, x)) is None


def test_discover_grows_heads_and_aggregates_from_evidence_only():
    w5 = dependence(Task("w5", ints(), lambda x: sum(lag(x, d) for d in range(5)), seq_len=10))
    grown, why = sized_for(DTConfig(), w5)
    assert max(grown.n_heads) == 4 and "4 pointer heads" in why
    assert [max(grown.rung(a)[1].n_heads) for a in range(5)] == [4] * 5     # the ladder keeps them
    same, why = sized_for(DTConfig(), dependence(wtc.tasks.get("max_last3")))
    assert same == DTConfig() and why == ""                                   # built-in sizes unchanged
    agg, why = sized_for(DTConfig(), dependence(wtc.tasks.get("running_sum")))
    assert agg.n_agg_heads == (2,) and "aggregate" in why
    assert [c.n_heads for c in (DTConfig().rung(a)[1] for a in range(5))] == [(3,), (3,), (3,), (3, 0), (3, 2)]


def test_a_failure_report_says_what_was_tried_and_what_is_missing(tmp_path):
    """An undertrained run on a prefix task: the report's diagnosis names the attempts, per-position
    scores of the best model, and that the target reads the whole prefix."""
    task = Task("cm3", ints(8, 3), lambda x: np.cumsum(x, 1) % 3, seq_len=8)
    d = wtc.discover(task, budget_s=1, progress=False,
                     config=DTConfig(steps=30, replicas=2, max_attempts=1, polish_iters=0, precision_iters=0))
    assert not d.solved
    assert d.dependence is not None and d.dependence.prefix == [True]     # a config given: still probed
    assert "aggregate heads" in d.sizing and "periodic sub-MLP units" in d.sizing, d.sizing
    lines = d.diagnosis()
    assert f"From that evidence discover began {d.sizing}." in lines
    assert lines[0].startswith("Tried 1 attempt(s)")
    assert any(line.startswith("The best model, per output position on fresh data: t=0:") for line in lines)
    assert any("reads the whole prefix" in line for line in lines)
    d.save(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "## Why it is not solved" in report and "whole prefix" in report and f"Discover began {d.sizing}." in report
    assert json.loads((tmp_path / "summary.json").read_text())["sizing"] == d.sizing


def test_a_rarely_visible_dependence_does_not_grow_the_model():
    """'any one so far' shows its dependence on early bits only when all later ones are zero: one
    probe saw scattered offsets (5 pointer heads); two probes must agree, so nothing spurious grows."""
    for seed in range(4):
        d = dependence(wtc.tasks.get("any_one"), seed=seed)
        assert sized_for(DTConfig(), d)[0] == DTConfig(), d.describe()


@pytest.mark.parametrize("task, seed, match", [("prev2", -1, "seed"), ("prev2", "x", "seed"), (None, 0, "a task is a name")])
def test_probe_arguments_are_checked(task, seed, match):
    with pytest.raises(wtc.tasks.TaskError, match=match):
        dependence(task, seed=seed)


@pytest.mark.parametrize("target, hi, oscillates", [
    (lambda x: 1 - x % 2, 100, True), (lambda x: x % 3, 30, True), (lambda x: x // 3, 30, True),
    (lambda x: np.isin(x, (2, 3, 5, 7)).astype(float), 10, True),
    (lambda x: x + lag(x, 1), 10, False), (lambda x: np.maximum(x, lag(x, 1)), 100, False),
    (lambda x: x * lag(x, 1), 10, False), (lambda x: x ** 2, 100, False),
    (lambda x: (x >= 50).astype(float), 100, False), (lambda x: np.abs(x - lag(x, 1)), 100, False),
])
def test_the_sweep_tells_oscillation_from_kinks_steps_and_curvature(target, hi, oscillates):
    d = dependence(Task("t", ints(10, hi), target, seq_len=10))
    assert bool(d.oscillating) == oscillates, d.describe()
    grown, why = sized_for(DTConfig(), d)
    assert (grown.mlp_periods != ()) == oscillates and ("periodic" in why) == oscillates
    if oscillates:
        assert "oscillating in x_t" in d.describe()


def test_real_inputs_sampled_unevenly_are_not_curvature():
    """Divided differences: a linear map of uniform draws (uneven spacing) has no turns."""
    task = Task("lin", lambda rng, n: rng.uniform(-3, 3, (n, 10)), lambda x: 2 * x - lag(x, 1), seq_len=10,
                output="real")
    assert dependence(task).oscillating == []


def test_no_builtin_task_is_sized_differently_by_the_oscillation_probe():
    for name in [n for n in wtc.tasks.names() if wtc.tasks.tier(n) != "wider"]:
        d = dependence(wtc.tasks.get(name))
        assert d is None or not d.oscillating, (name, d.describe())


@pytest.mark.parametrize("target, hi, order", [
    (lambda x: sum(lag(x, d) for d in range(5)), 10, 1),                       # additive
    (lambda x: x * lag(x, 1) + lag(x, 2), 10, 2),                               # a product of two
    (lambda x: np.max([lag(x, d) for d in range(3)], 0), 100, 3),
    (lambda x: np.max([lag(x, d) for d in range(5)], 0), 100, 5),
    (lambda x: (sum(lag(x, d) for d in range(5)) >= 3).astype(float), 2, 5),   # majority of five
    (lambda x: lag(x, 1) * lag(x, 2) * lag(x, 3) * lag(x, 4), 10, 4),
    (lambda x: np.max([lag(x, d) for d in range(7)], 0), 100, 7),
])
def test_the_interaction_order_is_the_most_inputs_one_computation_needs(target, hi, order):
    d = dependence(Task("t", ints(10, hi), target, seq_len=10))
    assert d.order == order, d.describe()
    grown, why = sized_for(DTConfig(), d)
    wide = order > 3                      # more than the ladder's 3-input rung reads: as many as interact
    assert grown.mlp_inputs == (order if wide else 2) and ("input sub-MLPs" in why) == wide
    assert grown.rung(1)[1].mlp_inputs == max(order, 3) and grown.rung(1)[1].mlp_depth == 2


def test_no_builtin_task_gets_wider_sub_mlps():
    """The built-ins stay as measured: none has more than three interacting inputs."""
    for name in [n for n in wtc.tasks.names() if wtc.tasks.tier(n) != "wider"]:
        d = dependence(wtc.tasks.get(name))
        assert d is None or sized_for(DTConfig(), d)[0].mlp_inputs == 2, (name, d.describe())


@pytest.mark.parametrize("name, target, hi, period", [
    ("count_mod7", lambda x: np.cumsum(x, 1) % 7, 7, 7),
    ("count_mod8", lambda x: np.cumsum(x, 1) % 8, 8, 8),
    # digits 0..3 at length 10: sums up to 30, two and a half periods of 12 (three are not seen)
    ("count_mod12", lambda x: np.cumsum(x, 1) % 12, 4, 12),
    # error diffusion: y_t = floor(S_t / 15) - floor(S_(t-1) / 15), a function of (x_t, S_t)
    ("dither15", lambda x: np.cumsum(x, 1) // 15 - np.concatenate([np.zeros((len(x), 1), x.dtype),
                                                                 np.cumsum(x, 1)[:, :-1] // 15], 1), 16, 15),
    ("sum", lambda x: np.cumsum(x, 1), 10, 0),
    ("running_max", lambda x: np.maximum.accumulate(x, 1), 10, 0),
    ("twice_sum_mod5_plus_x", lambda x: (2 * np.cumsum(x, 1)) % 5 + x, 5, 5),
])
def test_the_period_of_the_output_in_the_prefix_sum(name, target, hi, period):
    """y's period in the prefix sum S (at equal last input) is found where it exists, and a period
    discover's periodic units lack (7, 8, 15) is added to them; none for a sum or a running max."""
    task = Task(name, lambda rng, n: rng.integers(0, hi, (n, 10)), target, seq_len=10)
    dep = dependence(task)
    assert dep.sum_periods == [period], (name, dep.describe())
    config, why = sized_for(DTConfig(), dep)
    if period > 6:
        assert period in config.mlp_periods and str(period) in why, why
    elif period == 0:
        assert all(p <= 6 for p in config.mlp_periods)


def test_a_running_sum_of_a_computed_step_starts_with_sub_mlps_then_sum_heads():
    """y_t - y_(t-1) = g(x_t) (mod P) with g not affine: two layers, sub-MLPs then sum heads (and
    period P units for the residue); an affine step (a plain sum, a counter) leaves the layout."""
    digits = lambda rng, n: rng.integers(0, 10, (n, 10))                     # noqa: E731
    evens = Task("evens", digits, lambda x: np.cumsum(x % 2 == 0, 1), seq_len=10)
    dot = Task("dot2", lambda rng, n: rng.integers(0, 2, (n, 10, 2)),
               lambda x: np.cumsum(x[..., 0] * x[..., 1], 1) % 2, seq_len=10, n_inputs=2)
    for task, modulus in ((evens, 0), (dot, 2)):
        dep = dependence(task)
        assert (dep.step_modulus, dep.step_affine) == (modulus, False), task.name
        config, why = sized_for(DTConfig(), dep)
        assert (config.n_layers, config.n_heads, config.n_agg_heads, config.agg_ops) == (2, (0, 0), (0, 2), ("sum",))
        assert "sum heads in a second layer" in why and (modulus == 0 or modulus in config.mlp_periods), why
        kept, _ = sized_for(DTConfig(n_mlps=2), dep)                          # a layout set by hand stays
        assert kept.n_layers == 1
    for task in (Task("sum", digits, lambda x: np.cumsum(x, 1), seq_len=10),
                 Task("mod7", lambda rng, n: rng.integers(0, 7, (n, 10)), lambda x: np.cumsum(x, 1) % 7, seq_len=10)):
        dep = dependence(task)
        assert dep.step_affine and sized_for(DTConfig(), dep)[0].n_layers == 1, task.name
    window = Task("sum3", digits, lambda x: x + np.concatenate([np.zeros((len(x), 1), x.dtype), x[:, :-1]], 1), seq_len=10)
    assert dependence(window).step_modulus is None


def test_a_running_sum_of_a_running_sum_starts_with_sum_heads_in_two_layers():
    """y_t - 2 y_(t-1) + y_(t-2) = g(x_t) with g affine (a position under forces, with or without a
    constant pull; any sampler): step_order 2, and discover starts with sum heads in both layers.
    A first difference that is already a step stays order 1; a non-affine g at order 2 (a running
    sum of a count of evens) and a layout set by hand keep the one-layer start."""
    forces = lambda rng, n: rng.integers(-10, 11, (n, 10))                   # noqa: E731
    double = lambda x: np.cumsum(np.cumsum(x, 1), 1)                          # noqa: E731
    for task in (Task("position", forces, double, seq_len=10),
                 Task("position_pulled", forces, lambda x: double(x - 1), seq_len=10),
                 Task("position_bits", lambda rng, n: rng.integers(0, 2, (n, 12)), double, seq_len=12)):
        dep = dependence(task)
        assert (dep.step_modulus, dep.step_affine, dep.step_order) == (0, True, 2), task.name
        config, why = sized_for(DTConfig(), dep)
        assert (config.n_layers, config.n_heads, config.n_agg_heads, config.agg_ops) == (2, (0, 0), (2, 2), ("sum",))
        assert "running sum of a running sum" in why, why
        assert sized_for(DTConfig(n_agg_heads=1), dep)[0].n_layers == 1       # a layout set by hand stays
    digits = lambda rng, n: rng.integers(0, 10, (n, 10))                      # noqa: E731
    evens = Task("evens_sum", digits, lambda x: double(x % 2 == 0), seq_len=10)
    dep = dependence(evens)
    assert (dep.step_order, dep.step_affine) == (2, False)
    assert sized_for(DTConfig(), dep)[0].n_layers == 1
    assert dependence(Task("sum", digits, lambda x: np.cumsum(x, 1), seq_len=10)).step_order == 1
