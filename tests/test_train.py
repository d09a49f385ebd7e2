"""Training mechanics on tiny configurations (fast); the solving runs live in test_integration.py."""
import json

import numpy as np
import pytest
import torch

import wtc
from wtc import checkpoint_io
from wtc.dt import DTConfig, checkpoint
from wtc.dt.attempt import Attempt, tau_at
from wtc.dt.train import train

TINY = DTConfig(n_layers=1, n_heads=1, n_mlps=1, mlp_hidden=8, steps=20, hard_steps=5, polish_iters=5,
                replicas=2, max_attempts=1, batch_size=16, eval_sequences=64, precision_iters=10)


def test_tau_schedule_is_geometric():
    cfg = DTConfig(steps=101, tau_start=10.0, tau_end=0.1)
    taus = np.array([tau_at(cfg, s) for s in range(101)])
    assert taus[0] == pytest.approx(10.0) and taus[-1] == pytest.approx(0.1)
    np.testing.assert_allclose(taus[1:] / taus[:-1], (0.01) ** (1 / 100), rtol=1e-9)


def test_training_is_deterministic_for_a_seed():
    a, ha = train("sum_last2", TINY, seed=3, progress=False)
    b, hb = train("sum_last2", TINY, seed=3, progress=False)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    np.testing.assert_array_equal(ha.arrays()["loss"], hb.arrays()["loss"])


def test_history_records_entropies_and_freezes():
    model, history = train("parity_last2", TINY, seed=0, progress=False)
    a = history.arrays()
    assert a["loss"].shape[1] == 2 and a["sel_entropy"].shape[2] == len(history.slot_names)
    assert a["attn_entropy"].shape[2] == len(history.head_names) == 1
    assert history.phase[0] == "anneal" and history.phase[-1] == "hard"
    assert bool(model.frozen) and model.R == 1 and all(s.frozen for s in model.selectors())
    assert len(history.final["scores"]) == 2


def test_resumed_attempt_matches_uninterrupted(tmp_path):
    task = wtc.tasks.get("prev2")
    straight = Attempt(task, TINY, seed=1, attempt=0)
    for _ in range(24):
        straight.train_step()
    first = Attempt(task, TINY, seed=1, attempt=0)
    for _ in range(12):
        first.train_step()
    first.save(tmp_path / "state")
    resumed = Attempt(task, TINY, seed=1, attempt=0)
    resumed.restore(tmp_path / "state")
    assert resumed.step == 12
    for _ in range(12):
        resumed.train_step()
    for (k, v), (_, w) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(v, w), k
    assert resumed.history.step == straight.history.step
    other = Attempt(task, TINY, seed=2, attempt=0)
    with pytest.raises(checkpoint.CheckpointError, match="seed 1"):
        other.restore(tmp_path / "state")


def test_train_resume_reuses_finished_attempts(tmp_path):
    model, _ = train("prev2", TINY, seed=0, progress=False, checkpoint_dir=tmp_path)
    assert (tmp_path / "attempt0_result.json").exists()
    again, history = train("prev2", TINY, seed=0, progress=False, checkpoint_dir=tmp_path, resume=True)
    x = np.random.default_rng(0).integers(0, 100, (20, 10))
    np.testing.assert_array_equal(model.predict(x), again.predict(x))
    assert history.final["scores"]


def test_save_load_identical_predictions(tmp_path):
    model, _ = train("xor_pair", TINY, seed=0, progress=False)
    checkpoint.save(model, tmp_path / "m")
    loaded = checkpoint.load(tmp_path / "m")
    x = np.random.default_rng(5).integers(0, 2, (50, 10, 2))
    np.testing.assert_array_equal(model.predict(x), loaded.predict(x))
    assert loaded.structure() == model.structure()


def test_corrupt_checkpoints_are_reported(tmp_path):
    model, _ = train("prev2", TINY, seed=0, progress=False)
    checkpoint.save(model, tmp_path / "m")
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint directory"):
        checkpoint.load(tmp_path / "missing")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(checkpoint.CheckpointError, match="corrupt checkpoint tensors"):
        checkpoint.load(tmp_path / "m")
    checkpoint.save(model, tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    meta["config"]["mlp_activation"] = "relu" if meta["config"]["mlp_activation"] != "relu" else "silu"
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))      # fits the tensors, computes another function
    with pytest.raises(checkpoint.CheckpointError, match="metadata does not match its recorded sha256"):
        checkpoint.load(tmp_path / "m")
    checkpoint.save(model, tmp_path / "m")
    tensors, meta = checkpoint_io.read(tmp_path / "m" / "model")     # a consistent pair that does not fit
    meta["config"]["n_heads"] = [3]
    checkpoint_io.write_atomic(tmp_path / "m" / "model", tensors, meta)
    with pytest.raises(checkpoint.CheckpointError, match="do not match"):
        checkpoint.load(tmp_path / "m")
    (tmp_path / "m" / "model.json").write_text("{not json")
    with pytest.raises(checkpoint.CheckpointError, match="corrupt checkpoint metadata"):
        checkpoint.load(tmp_path / "m")


def test_train_rejects_bad_arguments():
    with pytest.raises(wtc.tasks.TaskError, match="unknown task"):
        train("nope", TINY)
    with pytest.raises(TypeError, match="DTConfig"):
        train("prev2", {"steps": 3})
    with pytest.raises(ValueError, match="budget_s"):
        train("prev2", TINY, budget_s=-1)


def test_history_plot(tmp_path):
    _, history = train("prev2", TINY, seed=0, progress=False)
    path = history.plot(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000 and path.endswith("h.png")


def test_parallel_attempts_give_the_sequential_result(tmp_path):
    """Two attempts in worker processes pick the same model as the sequential loop."""
    cfg = TINY.replace(max_attempts=2, steps=10, hard_steps=2)
    seq, hs = train("max_last3", cfg.replace(workers=1), seed=1, progress=False)
    par, hp = train("max_last3", cfg.replace(workers=2), seed=1, progress=False)
    assert seq.train_info["attempt"] == par.train_info["attempt"]
    assert seq.config.mlp_inputs == par.config.mlp_inputs
    x, _ = wtc.tasks.get("max_last3").batch(np.random.default_rng(5), 32)
    np.testing.assert_array_equal(seq.predict(x), par.predict(x))
    assert hs.final == hp.final


def test_restarts_grow_the_model():
    cfg = TINY.replace(max_attempts=2, steps=5, hard_steps=1, workers=1)
    assert Attempt(wtc.tasks.get("prev2"), cfg.rung(1)[1], 0, 1).model.config.mlp_inputs == 3


def test_parallel_attempts_resume_from_their_results(tmp_path):
    cfg = TINY.replace(max_attempts=2, steps=10, hard_steps=2, workers=2)
    first, _ = train("max_last3", cfg, seed=2, progress=False, checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.glob("attempt*_result.json")) == ["attempt0_result.json",
                                                                           "attempt1_result.json"]
    again, _ = train("max_last3", cfg, seed=2, progress=False, checkpoint_dir=tmp_path, resume=True)
    x, _ = wtc.tasks.get("max_last3").batch(np.random.default_rng(6), 16)
    np.testing.assert_array_equal(first.predict(x), again.predict(x))
