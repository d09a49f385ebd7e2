"""wtc.dt.layers inside a user's own PyTorch code: a plain Adam loop with the user's loss trains
DTLayers + LinearReadout on a task defined by two lambdas, wtc.extract reads the user's module,
the emitted source runs standalone and scores 1.0 on fresh data; state_dict round trips; a head
wtc cannot read is refused by name; bad inputs are one-line errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import wtc
from wtc.dt.attempt import tau_at
from wtc.dt.config import ConfigError, DTConfig
from wtc.dt.layers import Anneal, DTLayers, LinearReadout, compose, finish
from wtc.errors import ModelInputError, ModelInputTypeError
from wtc.extraction.reader import ExtractionInputError

T = 6
LR = 1e-2

# the user's own task: the sum of the last two values (0 before the start)
TASK = wtc.Task("layers_sum_last2", lambda rng, n: rng.integers(0, 10, (n, T)).astype(float),
                lambda x: x + np.pad(x[:, :-1], ((0, 0), (1, 0))), seq_len=T, output="integer")


class Net(torch.nn.Module):
    """A user's model: wtc's layers and readout, the user's forward."""

    def __init__(self, y_mean=0.0, y_std=1.0):
        super().__init__()
        self.dt = DTLayers(seq_len=T, n_heads=2, n_mlps=1, steps=300, hard_steps=100)
        self.head = LinearReadout(self.dt, 1, target_mean=y_mean, target_scale=y_std)

    def forward(self, x):
        return self.head(self.dt(x))


class ForeignHead(torch.nn.Module):
    def __init__(self, dt: DTLayers):
        super().__init__()
        self.dt = dt
        self.head = torch.nn.Sequential(torch.nn.Linear(dt.out_features, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, x):
        return self.head(self.dt(x))


def tensors(rng, n):
    return tuple(torch.as_tensor(a, dtype=torch.float32) for a in TASK.batch(rng, n))


@pytest.fixture(scope="module")
def trained():
    """The user's loop: Adam, their loss (MSE + the layers' redundancy penalty), lr scaled by the
    schedule, one schedule.step() per update; then finish() and extract(). One thread, as every
    test here runs (conftest's _one_thread is per function and starts after a module fixture)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train()
    finally:
        torch.set_num_threads(threads)


def _train():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    _, y = TASK.batch(rng, 1024)
    net = Net(y.mean(), y.std())
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    losses = []
    while net.dt.schedule.phase != "done":
        x, y = tensors(rng, 64)
        loss = F.mse_loss(net(x), y) + net.dt.redundancy_loss
        opt.zero_grad()
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = LR * net.dt.schedule.lr_scale
        opt.step()
        net.dt.schedule.step()
        losses.append(loss.item())
    finished = finish(net.dt, net.head, *TASK.batch(rng, 2048))
    return net, losses, finished, wtc.extract(net, TASK)


def test_plain_loop_trains_and_the_extracted_source_scores_one(trained):
    net, losses, finished, program = trained
    assert len(losses) == 400 and np.mean(losses[-20:]) < 0.1 * np.mean(losses[:20])
    assert net.dt.frozen and finished.mse_after < 1e-6 <= finished.mse_before
    assert program.ok, program.failures
    module: dict = {}
    exec(program.source, module)                    # a fresh namespace: only what the source imports
    fresh = TASK.fresh_batch(2000, [38, 1])
    pred = np.array([module["program"](seq[:, 0].tolist()) for seq in fresh.x])
    assert TASK.score(pred, fresh.y)["accuracy"] == 1.0
    with torch.no_grad():                           # the user's module agrees with its program
        net.eval()
        np.testing.assert_allclose(net(torch.as_tensor(fresh.x, dtype=torch.float32))[..., 0].numpy(), pred,
                                   atol=1e-3)
    assert wtc.verify(program, TASK, n=2000, seed=3).solved


def test_state_dict_round_trip_preserves_outputs(trained, rng):
    net = trained[0].eval()
    fresh = Net().eval()                            # never trained: normalisation comes with the state
    fresh.load_state_dict(net.state_dict())
    assert fresh.dt.frozen and bool(fresh.dt.inputs_fitted)
    assert set(net.state_dict()) >= {"dt.inputs_fitted", "dt.ranges_set", "dt.dt.x_scale", "head.target_mean"}
    x, _ = tensors(rng, 64)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), net(x), rtol=0, atol=0)
        torch.testing.assert_close(fresh.dt(x), net.dt(x), rtol=0, atol=0)
    assert wtc.extract(fresh, TASK).source == trained[3].source


def test_stream_is_named_and_composed_model_matches(trained, rng):
    net = trained[0].eval()
    x, _ = tensors(rng, 32)
    with torch.no_grad():
        stream = net.dt(x)
        model = compose(net.dt, net.head)
        want = model.denormalize_outputs(model(model.normalize_inputs(x))[0])[0]
    assert stream.shape == (32, T, len(net.dt.variable_names)) == (32, T, net.dt.out_features)
    assert net.dt.variable_names[:2] == ["x", "pos"]
    torch.testing.assert_close(stream[..., 0], x[..., 0] / net.dt.input_scale[0])   # x in model units
    torch.testing.assert_close(net.head(stream), want)


def test_a_foreign_head_is_refused_by_name(trained):
    user = ForeignHead(trained[0].dt)
    with pytest.raises(ExtractionInputError, match=r"cannot read 'head' \(torch\.nn\.Sequential\): the program "
                                                   r"would ignore it; .*LinearReadout") as err:
        wtc.extract(user, TASK)
    assert "\n" not in str(err.value)


def test_a_forward_that_changes_the_output_is_refused(trained):
    net = trained[0]

    class Doubled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dt, self.head = net.dt, net.head

        def forward(self, x):
            return 2 * self.head(self.dt(x))

    class Unused(Net):                              # a foreign module that does not change the output
        def __init__(self):
            super().__init__()
            self.dt, self.head, self.extra = net.dt, net.head, torch.nn.Linear(3, 3)

    with pytest.raises(ExtractionInputError, match="changes the inputs or the readout's output"):
        wtc.extract(Doubled(), TASK)
    assert wtc.extract(Unused(), TASK).source == trained[3].source


def test_what_extract_cannot_read_is_refused():
    net = Net()
    with pytest.raises(ExtractionInputError, match="is not frozen"):
        wtc.extract(net, TASK)
    with pytest.raises(ExtractionInputError, match="returns the stream"):
        wtc.extract(net.dt, TASK)
    with pytest.raises(ExtractionInputError, match="holds no DTLayers"):
        wtc.extract(torch.nn.Linear(2, 2), TASK)
    with pytest.raises(ExtractionInputError, match="DiscreteTransformer at 'inner'"):
        holder = torch.nn.Module()
        holder.inner = wtc.DiscreteTransformer(DTConfig(), seq_len=T)
        wtc.extract(holder, TASK)
    with pytest.raises(ExtractionInputError, match="torch module built from wtc.dt.layers, got str"):
        wtc.extract("model", TASK)


def test_normalisation_is_part_of_the_module():
    torch.manual_seed(0)
    given = DTLayers(seq_len=T, input_range=(-4, 2)).eval()
    assert bool(given.inputs_fitted) and float(given.input_scale[0]) == 4.0
    assert given(torch.zeros(3, T)).shape == (3, T, given.out_features)     # eval works at once
    lazy = DTLayers(seq_len=T, n_inputs=2)
    with pytest.raises(ModelInputError, match="no input normalisation yet"):
        lazy.eval()(torch.ones(2, T, 2))
    lazy.train()(torch.tensor([[[3.0, -5.0]] * T]))                      # the first training batch fits it
    assert lazy.input_scale.tolist() == [3.0, 5.0] and bool(lazy.ranges_set)


@pytest.mark.parametrize("call,error,match", [
    (lambda dt: dt(torch.zeros(2, T + 1, 1)), ModelInputError, r"takes inputs \(B, T=6, n_inputs=1\).*got shape \(2, 7, 1\)"),
    (lambda dt: dt(torch.zeros(2, T, 3)), ModelInputError, r"got shape \(2, 6, 3\)"),
    (lambda dt: dt(torch.zeros(0, T)), ModelInputError, "B >= 1"),
    (lambda dt: dt(np.zeros((2, T))), ModelInputTypeError, "takes a torch tensor"),
    (lambda dt: dt(torch.full((2, T), float("nan"))), ModelInputError, "NaN or inf"),
    (lambda dt: LinearReadout(dt)(torch.zeros(2, T, 3)), ModelInputError, r"stream \(B, T, V=4\), got shape"),
    (lambda dt: LinearReadout(dt, 0), ConfigError, "out_features must be a positive integer"),
    (lambda dt: LinearReadout(dt, target_scale=0), ConfigError, "target_scale must be finite and > 0"),
    (lambda dt: DTLayers(seq_len=0), ConfigError, "seq_len must be a positive integer"),
    (lambda dt: DTLayers(seq_len=T, input_range=(3, 1)), ConfigError, "lo <= hi"),
    (lambda dt: DTLayers(seq_len=T, n_hedas=2), ConfigError, "n_hedas"),
    (lambda dt: finish(dt, LinearReadout(dt), np.zeros((4, T)), np.zeros((4, T + 1))), ModelInputError,
     r"y has shape \(4, 7, 1\)"),
])
def test_bad_input_is_a_one_line_error(call, error, match):
    dt = DTLayers(seq_len=T, n_heads=1, n_mlps=1, input_range=(0, 9))
    assert dt.out_features == 4                    # x, pos, L0.h0, L0.m0
    with pytest.raises(error, match=match) as err:
        call(dt)
    assert "\n" not in str(err.value)


def test_the_schedule_is_wtc_trains():
    config = DTConfig(steps=50, hard_steps=10, tau_start=5.0, tau_end=0.05, hard_lr_scale=0.1)
    anneal = Anneal.from_config(config)
    taus, phases, scales = [], [], []
    for _ in range(62):
        taus.append(anneal.temperature)
        phases.append(anneal.phase)
        scales.append(anneal.lr_scale)
        anneal.step()
    assert taus[:50] == [tau_at(config, s) for s in range(50)]             # wtc.train's own schedule
    assert taus[0] == 5.0 and taus[49] == pytest.approx(0.05) and min(taus) == pytest.approx(0.05)
    assert phases == ["anneal"] * 50 + ["hard"] * 10 + ["done"] * 2
    assert scales == [1.0] * 50 + [0.1] * 12
    first, hard = Anneal(steps=3).sampling(), Anneal(steps=3, done=3).sampling()
    assert (first.noise, first.hard, first.tau) == (True, False, 10.0)
    assert (hard.noise, hard.hard, hard.straight_through) == (False, True, True)
    assert Anneal(**anneal.state_dict()) == anneal
    with pytest.raises(ConfigError, match="tau_end"):
        Anneal(tau_start=1.0, tau_end=2.0)
    with pytest.raises(ConfigError, match="done must be"):
        Anneal(done=-1)
    with pytest.raises(ConfigError, match="schedule must be"):
        DTLayers(seq_len=T, schedule=config)
