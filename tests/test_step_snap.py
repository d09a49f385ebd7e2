"""Summed steps set to their levels (wtc.dt.step_snap): the rounding's semantics, the levels found,
the search for summed steps, a planted dot-product parity read back as `sum % 2` and right on runs
far longer than training's (a near-whole step, and one of two levels), and checkpoints from before
the levels and the output unit existed."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import wtc
from wtc.checkpoint_io import read
from wtc.dt import DTConfig, DiscreteTransformer, checkpoint
from wtc.dt.attempt import Attempt
from wtc.dt.finish import refit_head
from wtc.dt.step_snap import levels_of, snap_steps, summed_steps
from wtc.dt.selection import EVAL
from wtc.extraction import extract, verify

DOT = dict(n_layers=2, n_heads=(0, 0), n_agg_heads=(0, 1), agg_ops=("sum",), n_mlps=(1, 1), mlp_inputs=2,
           mlp_hidden=4, mlp_periods=(2,), replicas=2)


def _dot_parity_task():
    """The parity of the dot product of two bit strings so far, as a user declares it."""
    return wtc.Task("dot_parity_user", lambda rng, n: rng.integers(0, 2, (n, 10, 2)),
                    lambda x: np.cumsum(x[..., 0] * x[..., 1], axis=1) % 2, seq_len=10, n_inputs=2,
                    any_length=True)


def _pin(model, pins: dict[str, str]) -> None:
    names = model.variable_names
    with torch.no_grad():
        for sel in model.selectors():
            for s, slot in enumerate(sel.slot_names):
                if slot in pins:
                    sel.logits[:, s] = -10.0
                    sel.logits[:, s, names.index(pins[slot])] = 10.0
    model.freeze()
    model.eval()


PINS = {"L0.m0.in0": "x0", "L0.m0.in1": "x1", "L1.a0.v": "L0.m0", "L1.m0.in0": "L1.a0", "L1.m0.in1": "L1.a0"}


def _planted_dot_parity(step: float):
    """A frozen two-layer model of the dot-product parity: L0.m0 = step * relu(x0 + x1 - 1) (step
    times the product on bits), L1.a0 its running sum, L1.m0 = 1/2 - 1/2 cos(pi * sum) through its
    periodic unit; head refit. (task, attempt) with the model at attempt.model."""
    task = _dot_parity_task()
    run = Attempt(task, DTConfig(**DOT), seed=0, attempt=0)
    model = run.model
    _pin(model, PINS)
    first, second = model.blocks[0].mlp, model.blocks[1].mlp
    with torch.no_grad():
        for mlp in (first, second):
            for p in mlp.parameters_of_map():
                p.zero_()
        first.W1[:, 0, 0] = 1.0                          # hidden unit 0 (a ReLU): x0 + x1 - 1
        first.b1[:, 0, 0] = -1.0
        first.W2[:, 0, 0] = step
        second.b2[:] = 0.5
        second.W_per[:, 0, 0, 0] = -0.5                  # cos(2 pi * 1/2 * sum), the one feature of period 2
    x, y, valid, _ = run.fit_data
    refit_head(model, x, y, valid)
    return task, run


def _source_program(program):
    namespace: dict = {}
    exec(program.source, namespace)                       # as a user runs it: the source, in a fresh namespace
    return namespace["program"]


def test_a_whole_output_is_rounded_once_frozen_and_passes_no_gradient():
    torch.manual_seed(0)
    model = DiscreteTransformer(DTConfig(**DOT), seq_len=6, n_inputs=2)
    x = torch.rand(5, 6, 2) * 3
    hook = "blocks.0.mlp.hook_post"
    _pin(model, PINS)
    with model.caching([hook]) as free:
        model(x, EVAL)
    with torch.no_grad():
        model.blocks[0].mlp.whole[0, 0] = True
    with model.caching([hook]) as rounded:
        model(x, EVAL)[0].sum().backward()
    assert torch.equal(rounded[hook][0], free[hook][0].round())
    assert torch.equal(rounded[hook][1], free[hook][1])             # the other replica as it was
    grad = model.blocks[0].mlp.W2.grad
    assert torch.all(grad[0, 0] == 0) and grad[1, 0].abs().sum() > 0


def test_summed_steps_are_the_sub_mlp_outputs_a_sum_head_adds_up():
    model = DiscreteTransformer(DTConfig(**DOT), seq_len=6, n_inputs=2)
    _pin(model, PINS)
    assert summed_steps(model) == {0: [(0, 0)], 1: [(0, 0)]}
    _pin(model := DiscreteTransformer(DTConfig(**DOT), seq_len=6, n_inputs=2), {**PINS, "L1.a0.v": "x0"})
    assert summed_steps(model) == {}                                  # the sum head adds up an input
    no_periods = DiscreteTransformer(DTConfig(**{**DOT, "mlp_periods": ()}), seq_len=6, n_inputs=2)
    _pin(no_periods, PINS)
    assert summed_steps(no_periods) == {0: [(0, 0)], 1: [(0, 0)]}     # a count is a summed step too


@pytest.mark.parametrize("values,levels", [
    ([0.0, 2.97, 3.02, -0.04], (0.0, 1.0)),          # near whole numbers: rounded to them
    ([0.0, 3.0, 1.0], None),                          # whole already
    ([0.78, 4.01, 4.0, 0.79], (0.78, 3.23)),          # two levels: 0 and 1
    ([0.5, 1.51, 2.49, 0.5], (0.5, 0.995)),           # three evenly spaced levels: 0, 1, 2
    ([2.5, 2.5], None),                               # a constant
    ([0.0, 0.3, 1.7, 2.0], None),                     # neither
])
def test_levels_of_a_step(values, levels):
    got = levels_of(torch.tensor(values, dtype=torch.float64))
    assert got == levels if levels is None else got == pytest.approx(levels)


def test_a_near_whole_step_is_snapped_and_the_parity_reads_as_the_sum_mod_2(tmp_path):
    """Step 0.97: the periodic unit reads cos(0.97 pi k), right on short runs, wrong once k is
    about 16. Snapped, the step is whole, the loss falls to float32 noise, extraction reads the
    output as `sum % 2` and the program, exec'd from its source, is right on runs of 40 ones; the
    rounding survives a checkpoint loaded in a new process."""
    task, run = _planted_dot_parity(0.97)
    model = run.model
    x, y, valid, _ = run.fit_data
    snaps = snap_steps(model, x[:256], y[:256], valid[:256])
    assert [(s["replica"], s["mlp"], s["values"]) for s in snaps] == [(0, "L0.m0", [0, 1]), (1, "L0.m0", [0, 1])]
    assert all(s["loss_after"] < 1e-6 * s["loss_before"] for s in snaps), snaps
    assert bool(model.blocks[0].mlp.whole.all())
    one = model.replica(0)
    program = extract(one, task)
    assert program.ok, program.failures
    assert "% 2" in program.source and "cos" not in program.source, program.source
    run_program = _source_program(program)
    xs = np.random.default_rng(3).integers(0, 2, (50, 40, 2))
    xs[:10] = 1                                                       # 40 positions where both bits are 1
    want = task.target(xs)
    assert all(list(run_program(s.tolist())) == list(w) for s, w in zip(xs, want))
    assert verify(program, task, n=2000, seed=5).solved
    checkpoint.save(one, tmp_path / "m")
    np.save(tmp_path / "x.npy", xs[:, :10].astype(float))                # the model runs at its own length
    code = ("import numpy as np, wtc.dt.checkpoint as c; m = c.load(r'%s'); x = np.load(r'%s'); "
            "assert bool(m.blocks[0].mlp.whole.all()); "
            "assert np.array_equal(m.predict(x), np.cumsum(x[..., 0] * x[..., 1], axis=1) %% 2)") % (
        tmp_path / "m", tmp_path / "x.npy")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_a_step_of_two_levels_is_set_to_their_index():
    """Step 0.7 on a pair of ones, 0 elsewhere: two levels, set to 0 and 1 (origin 0, size 0.7);
    the periodic unit then reads the count's parity exactly, as for a near-whole step."""
    task, run = _planted_dot_parity(0.7)
    x, y, valid, _ = run.fit_data
    snaps = snap_steps(run.model, x[:256], y[:256], valid[:256])
    assert [(s["origin"], round(s["size"], 4), s["values"]) for s in snaps] == [(0.0, 0.7, [0, 1])] * 2
    xs = np.random.default_rng(6).integers(0, 2, (200, 10, 2)).astype(float)
    xs[:10] = 1
    assert np.array_equal(run.model.predict(xs, replica=0), task.target(xs))


def test_a_whole_step_is_left_alone():
    task, run = _planted_dot_parity(1.0)
    x, y, valid, _ = run.fit_data
    assert snap_steps(run.model, x[:256], y[:256], valid[:256]) == []
    assert not bool(run.model.blocks[0].mlp.whole.any())


def test_a_checkpoint_from_before_rounding_and_output_units_keeps_its_meaning(tmp_path):
    """Written before SubMLPs' levels and output unit: nothing rounded, and no sub-MLP output read
    by a periodic unit (unit 0), so it predicts what it predicted when it was saved."""
    task, run = _planted_dot_parity(0.97)
    model = run.model.replica(0)
    checkpoint.save(model, tmp_path / "m")
    tensors, meta = read(tmp_path / "m" / "model")
    old = {k: v for k, v in tensors.items()
           if not k.endswith((".mlp.whole", ".mlp.level_origin", ".mlp.level_size", ".mlp.output_unit"))}
    assert len(old) < len(tensors)
    loaded = checkpoint.build_model(meta, old)
    assert not bool(loaded.blocks[0].mlp.whole.any())
    assert float(loaded.blocks[1].mlp.output_unit) == 0.0
    reference = model.replica(0)
    with torch.no_grad():
        for block in reference.blocks:
            if block.mlp is not None:
                block.mlp.output_unit.zero_()
    xs = np.random.default_rng(4).integers(0, 2, (20, 10, 2)).astype(float)
    assert np.array_equal(loaded.predict(xs), reference.predict(xs))
    assert not np.array_equal(loaded.predict(xs), model.predict(xs))   # unit 1 reads the sum: it differs
