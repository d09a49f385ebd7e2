"""The shared training loop (wtc.models.training): a run stopped after k steps and resumed in a
fresh trainer equals an uninterrupted one bit for bit (weights, AdamW state, history, metrics, RNG
draws); resumes of another config are refused by field; the learning-rate schedule; forks; the
atomic checkpoint pair (wtc.checkpoint_io)."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wtc import checkpoint_io
from wtc.errors import CheckpointError, TrainConfigError, TrainingError
from wtc.models import Transformer, TransformerConfig
from wtc.models import training as T

SHAPE = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32, "d_vocab": 11, "n_ctx": 8}


def make(seed=0, **kw):
    return Transformer(TransformerConfig(**{**SHAPE, **kw}), seed=seed)


def trainer(model, path, cfg=None, gen_seed=0, identity=None, decay=lambda n, p: p.ndim >= 2, **kw):
    """A trainer exercising every moving part: decay groups, warmup + cosine, clipping, a post-step
    hook that changes the weights, batches from a numpy Generator drawn in order, a loss that
    draws from a torch Generator and from torch's global RNG, and two Evals."""
    cfg = cfg or T.TrainConfig(steps=9, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, grad_clip=0.5, warmup=2,
                               schedule="cosine", min_lr_frac=0.1)
    rng = np.random.default_rng(gen_seed)
    noise = torch.Generator().manual_seed(gen_seed)

    def batch_fn(step):
        return torch.from_numpy(rng.integers(0, 11, (4, 8)))

    def loss_fn(tokens):
        logits = model(tokens)
        scale = 1 + 0.1 * torch.rand((), generator=noise) + 0.1 * torch.rand(())
        return scale * F.cross_entropy(logits[:, :-1].reshape(-1, 11), tokens[:, 1:].reshape(-1))

    def shrink(t):                                   # a post-step hook that edits weights
        with torch.no_grad():
            w = model.blocks[0].mlp.W_in
            w.masked_fill_(w.abs() < 0.01, 0.0)
        return {"zeros": float((w == 0).float().mean())}

    evals = (T.Eval("norm", lambda t: {"w": float(model.unembed.W_U.detach().norm())}, every=2, at={0}),
             T.Eval("last", lambda t: {"n": len(t.history["loss"])}, at={cfg.steps}))
    return T.Trainer(model, cfg, batch_fn, loss_fn, path=path, identity=identity or {"data": "x"},
                     decay=decay, post_step=shrink, evals=evals, rngs={"rng": rng, "noise": noise},
                     checkpoint_every=4, progress=False, **kw)


def same_state(a: T.TrainState, b: T.TrainState):
    assert a.step == b.step
    assert a.model_state.keys() == b.model_state.keys()
    for k in a.model_state:
        assert torch.equal(a.model_state[k], b.model_state[k]), k
    for i, st in a.optimizer["state"].items():
        for key, v in st.items():
            assert torch.equal(v, b.optimizer["state"][i][key]), (i, key)
    assert a.history == b.history and a.metrics == b.metrics
    assert all(torch.equal(a.rng_torch[k], b.rng_torch[k]) for k in a.rng_torch) and a.rng_numpy == b.rng_numpy


@pytest.mark.parametrize("k", [1, 4, 6])
def test_stopping_and_resuming_equals_an_uninterrupted_run(tmp_path, k):
    torch.manual_seed(123)
    full_model = make(seed=1)
    full = trainer(full_model, tmp_path / "full" / "state").run()
    assert full.finished and full.step == 9 and len(full.losses) == 9
    assert [m["step"] for m in full.metrics["norm"]] == [0, 2, 4, 6, 8]
    assert full.metrics["last"] == [{"step": 9, "n": 9}]
    assert set(full.history) == {"step", "loss", "lr", "zeros"}
    assert full.history["lr"][0] == pytest.approx(1.5e-3) and full.history["lr"][-1] == pytest.approx(3e-4)

    torch.manual_seed(123)
    part = trainer(make(seed=1), tmp_path / "part" / "state").run(stop_after=k)
    assert not part.finished and part.step == k
    # the resume: a fresh process would build everything anew, with other seeds that must not matter
    torch.manual_seed(999)
    resumed_model = make(seed=7)
    t = trainer(resumed_model, tmp_path / "part" / "state", gen_seed=5)
    assert t.resume() and t.step == k
    res = t.run()
    assert res.finished and res.history == full.history and res.metrics == full.metrics
    for name, p in full_model.state_dict().items():
        assert torch.equal(resumed_model.state_dict()[name], p), name
    same_state(T.read_state(tmp_path / "full" / "state"), T.read_state(tmp_path / "part" / "state"))
    assert torch.equal(torch.get_rng_state(), T.read_state(tmp_path / "full" / "state").rng_torch["torch"])
    assert res.seconds >= part.seconds > 0


def test_a_finished_run_is_reused_and_loads_as_a_plain_model(tmp_path):
    model = make()
    trainer(model, tmp_path / "s").run()
    stamp = (tmp_path / "s.safetensors").stat().st_mtime_ns
    again = trainer(make(seed=3), tmp_path / "s")
    r = again.run()
    assert r.finished and r.seconds_per_step is None and (tmp_path / "s.safetensors").stat().st_mtime_ns == stamp
    for k, v in T.load_model(tmp_path / "s").state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    assert json.loads((tmp_path / "s.json").read_text())["step"] == 9


def test_a_resume_of_another_config_is_refused_by_field(tmp_path):
    trainer(make(), tmp_path / "s").run(stop_after=2)
    other = T.TrainConfig(steps=9, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, grad_clip=0.5, warmup=2,
                          schedule="cosine", min_lr_frac=0.1)
    with pytest.raises(CheckpointError, match=r"\['lr'\]"):
        trainer(make(), tmp_path / "s", cfg=other).run()
    longer = T.TrainConfig(**{**other.__dict__, "lr": 3e-3, "steps": 12})     # the cosine depends on steps
    with pytest.raises(CheckpointError, match="steps"):
        trainer(make(), tmp_path / "s", cfg=longer).run()
    with pytest.raises(CheckpointError, match="data"):
        trainer(make(), tmp_path / "s", identity={"data": "y"}).run()
    with pytest.raises(CheckpointError, match="model.d_mlp"):
        trainer(make(d_mlp=48), tmp_path / "s").run()
    with pytest.raises(CheckpointError, match=r"weight decay applies to other parameters.*b_in"):
        trainer(make(), tmp_path / "s", decay=lambda n, p: True).run()       # biases decayed now
    with pytest.raises(CheckpointError, match="weight decay applies to other parameters"):
        trainer(make(), tmp_path / "s", decay=None).run()
    (tmp_path / "s.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        trainer(make(), tmp_path / "s").run()


def test_a_constant_schedule_run_can_be_extended(tmp_path):
    def cfg(steps):
        return T.TrainConfig(steps=steps, lr=2e-3)

    a, b = make(seed=2), make(seed=2)
    torch.manual_seed(0)                                      # the loss draws from the global RNG
    trainer(a, tmp_path / "a", cfg=cfg(5)).run()
    r = trainer(a, tmp_path / "a", cfg=cfg(8)).run()          # continues from 5
    torch.manual_seed(0)
    s = trainer(b, tmp_path / "b", cfg=cfg(8)).run()
    assert r.history == s.history and r.step == 8
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_fork_keeps_weights_moments_and_step_under_a_new_config(tmp_path):
    cfg = T.TrainConfig(steps=4, lr=1e-3, weight_decay=1.0)
    src = make(seed=4)
    trainer(src, tmp_path / "main", cfg=cfg).run()
    fork = make(seed=8)
    t = trainer(fork, tmp_path / "wd0", cfg=T.TrainConfig(steps=6, lr=1e-3, weight_decay=0.0), gen_seed=1)
    t.fork_from(tmp_path / "main")
    assert t.step == 4 and t.history["loss"] == [] and all(v == [] for v in t.metrics.values())
    assert all(torch.equal(fork.state_dict()[k], v) for k, v in src.state_dict().items())
    assert all(g["weight_decay"] == 0.0 for g in t.optimizer.param_groups)
    r = t.run()
    assert r.history["step"] == [5, 6]
    assert [m["step"] for m in r.metrics["norm"]] == [6]             # no start evals for a fork
    assert T.read_state(tmp_path / "wd0").optimizer["param_groups"][0]["weight_decay"] == 0.0
    with pytest.raises(TrainConfigError, match="fork_from"):
        t.fork_from(tmp_path / "main")


def test_a_non_finite_loss_stops_training_and_keeps_the_checkpoint(tmp_path):
    model = make()
    calls = []

    def loss_fn(tokens):
        calls.append(1)
        loss = F.cross_entropy(model(tokens)[:, -1], tokens[:, 0])
        return loss * (math.inf if len(calls) == 3 else 1.0)

    t = T.Trainer(model, T.TrainConfig(steps=5), lambda s: torch.randint(0, 11, (2, 8)), loss_fn, path=tmp_path / "s",
                  checkpoint_every=1, progress=False)
    with pytest.raises(TrainingError, match="at step 2") as info:
        t.run()
    assert isinstance(info.value, FloatingPointError) and "intact" in str(info.value)
    assert T.read_state(tmp_path / "s").step == 2


def test_learning_rate_schedule():
    cfg = T.TrainConfig(steps=100, lr=1.0, warmup=10, schedule="cosine", min_lr_frac=0.1)
    lr = [T.lr_at(s, cfg) for s in range(100)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == 1.0 and lr[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lr[9:], lr[10:]))
    flat = T.TrainConfig(steps=100, lr=0.5, warmup=4)
    assert [T.lr_at(s, flat) for s in (0, 3, 4, 99, 500)] == [0.125, 0.5, 0.5, 0.5, 0.5]
    assert "steps" not in flat.result_fields() and "steps" in cfg.result_fields()


@pytest.mark.parametrize("field,value", [("steps", -1), ("lr", 0.0), ("lr", float("nan")), ("betas", (0.9, 1.0)),
                                         ("weight_decay", -1.0), ("grad_clip", 0.0), ("warmup", 1.5),
                                         ("schedule", "linear"), ("min_lr_frac", 1.5), ("eps", 0)])
def test_bad_train_config_values_are_named(field, value):
    with pytest.raises(TrainConfigError, match=field):
        T.TrainConfig(**{"steps": 10, field: value})


def test_a_pair_torn_between_its_renames_is_completed_or_refused(tmp_path):
    path = tmp_path / "c"
    checkpoint_io.write_atomic(path, {"a": torch.zeros(2)}, {"v": 1})
    # a kill after the tensors were renamed into place and before the JSON was: redo that save by
    # hand up to that point, then read
    checkpoint_io.write_atomic(tmp_path / "next", {"a": torch.ones(2)}, {"v": 2})
    (tmp_path / "next.safetensors").replace(path.with_suffix(".safetensors"))
    (tmp_path / "next.json").replace(path.with_suffix(".json.tmp"))
    tensors, meta = checkpoint_io.read(path)
    assert meta == {"v": 2} and torch.equal(tensors["a"], torch.ones(2))
    assert not path.with_suffix(".json.tmp").exists()
    # new tensors beside an old JSON and no pending one: refused, never mixed
    checkpoint_io.write_atomic(tmp_path / "other", {"a": torch.full((2,), 3.0)}, {"v": 3})
    (tmp_path / "other.safetensors").replace(path.with_suffix(".safetensors"))
    with pytest.raises(CheckpointError, match="different saves"):
        checkpoint_io.read(path)


@pytest.mark.parametrize("where", ["batch_fn", "loss_fn", "post_step", "eval"])
def test_a_callback_that_raises_is_named_and_the_checkpoint_kept(tmp_path, where):
    model = make()
    calls = {"n": 0}

    def boom(*_):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyError("boom")

    batch = (lambda step: boom() or torch.zeros(2, 8, dtype=torch.long)) if where == "batch_fn" else \
        (lambda step: torch.zeros(2, 8, dtype=torch.long))

    def loss(tokens):
        if where == "loss_fn":
            boom()
        return F.cross_entropy(model(tokens)[:, :-1].reshape(-1, 11), tokens[:, 1:].reshape(-1))

    evals = (T.Eval("e", lambda t: boom() or {"x": 1.0}, every=1),) if where == "eval" else ()
    t = T.Trainer(model, T.TrainConfig(steps=8, lr=1e-3), batch, loss, path=tmp_path / "s", checkpoint_every=1,
                  post_step=(lambda tr: boom()) if where == "post_step" else None, evals=evals, progress=False)
    name = {"eval": "Eval 'e'"}.get(where, where)
    with pytest.raises(TrainingError, match=rf"{name} raised KeyError at step \d: 'boom'; the last checkpoint"):
        t.run()
    assert T.read_state(tmp_path / "s").step >= 2


@pytest.mark.parametrize("bad, match", [(lambda t: 3.0, "must return a scalar tensor"),
                                        (lambda t: torch.ones(2, requires_grad=True).sum() * torch.ones(2),
                                         "must return a scalar tensor")])
def test_a_loss_that_is_not_a_scalar_tensor_is_named(bad, match):
    t = T.Trainer(make(), T.TrainConfig(steps=2, lr=1e-3), lambda s: None, bad, progress=False)
    with pytest.raises(TrainingError, match=match):
        t.run()


def test_callbacks_must_return_dicts():
    model = make()
    tokens = torch.zeros(2, 8, dtype=torch.long)

    def loss(b):
        return F.cross_entropy(model(tokens)[:, :-1].reshape(-1, 11), tokens[:, 1:].reshape(-1))

    with pytest.raises(TrainingError, match="post_step must return a dict or None, got list"):
        T.Trainer(model, T.TrainConfig(steps=2, lr=1e-3), lambda s: None, loss, post_step=lambda t: [1],
                  progress=False).run()
    with pytest.raises(TrainingError, match="Eval 'e' must return a dict or None, got float"):
        T.Trainer(model, T.TrainConfig(steps=2, lr=1e-3), lambda s: None, loss,
                  evals=(T.Eval("e", lambda t: 1.0, every=1),), progress=False).run()


def test_trainer_arguments_that_would_be_silently_odd(tmp_path):
    model = make()

    def batch(step):
        return torch.zeros(2, 8, dtype=torch.long)

    def loss(b):
        return F.cross_entropy(model(b)[:, :-1].reshape(-1, 11), b[:, 1:].reshape(-1))

    cfg = T.TrainConfig(steps=4, lr=1e-3)
    with pytest.raises(TrainConfigError, match="checkpoint_every must be None or a positive int"):
        T.Trainer(model, cfg, batch, loss, checkpoint_every=0)
    with pytest.raises(TrainConfigError, match="checkpoint_at must be a collection of step numbers"):
        T.Trainer(model, cfg, batch, loss, checkpoint_at="12")
    with pytest.raises(TrainConfigError, match="is the stem of a checkpoint pair"):
        T.Trainer(model, cfg, batch, loss, path=tmp_path)                 # a directory: would write tmp.json
    with pytest.raises(TrainConfigError, match="warmup"):
        T.TrainConfig(steps=5, warmup=100)
    T.Trainer(model, T.TrainConfig(steps=6, lr=1e-3), batch, loss, path=tmp_path / "s", progress=False).run()
    with pytest.raises(CheckpointError, match="6 steps done, more than steps=1"):
        T.Trainer(model, T.TrainConfig(steps=1, lr=1e-3), batch, loss, path=tmp_path / "s", progress=False).run()


def test_an_eval_stop_ends_training_at_its_record_and_a_resume_trains_no_more(tmp_path):
    """Stop once the recorded step reaches 4 (a predicate on the record): the run ends there,
    checkpointed, equal to a run stopped by stop_after=4; a resume trains no further; a stop
    that never holds trains to the end."""
    def build(path, stop, at=()):
        model = make(seed=1)
        cfg = T.TrainConfig(steps=9, lr=3e-3)
        rng = np.random.default_rng(0)
        return model, T.Trainer(model, cfg, lambda s: torch.from_numpy(rng.integers(0, 11, (4, 8))),
                                lambda x: F.cross_entropy(model(x)[:, :-1].reshape(-1, 11), x[:, 1:].reshape(-1)),
                                path=path, rngs={"rng": rng}, progress=False,
                                evals=(T.Eval("probe", lambda t: {"s": t.step}, every=2, at=at, stop=stop),))
    _, t = build(tmp_path / "a", lambda rec: rec["s"] >= 4)
    r = t.run()
    assert (r.step, r.finished, r.stopped_by) == (4, False, "probe") and len(r.losses) == 4
    assert T.read_state(tmp_path / "a").step == 4
    m_ref, ref = build(tmp_path / "b", None)
    ref.run(stop_after=4)
    same_state(T.read_state(tmp_path / "a"), T.read_state(tmp_path / "b"))
    _, again = build(tmp_path / "a", lambda rec: rec["s"] >= 4)
    r2 = again.run()
    assert (r2.step, r2.stopped_by, r2.seconds_per_step) == (4, "probe", None)
    _, never = build(tmp_path / "c", lambda rec: False)
    r3 = never.run()
    assert (r3.step, r3.finished, r3.stopped_by) == (9, True, None)
    with pytest.raises(TrainConfigError, match="stop"):
        T.Eval("x", lambda t: {}, every=1, stop=3)
    _, at_start = build(tmp_path / "e", lambda rec: True, at={0})       # met by the record before any update
    r4 = at_start.run()
    assert (r4.step, r4.stopped_by, r4.losses) == (0, "probe", [])
    _, bad = build(tmp_path / "d", lambda rec: rec["missing"])
    with pytest.raises(TrainingError, match="stop raised KeyError"):
        bad.run()
