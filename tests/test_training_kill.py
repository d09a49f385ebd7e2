"""A training run killed mid-way resumes from what it checkpointed and ends where an uninterrupted
run ends (wtc.models.training, wtc.models.interrupts): Ctrl-C and SIGTERM are held until the update
in flight is whole and then checkpointed at that step; a kill -9 leaves the checkpoint written when
the run started (or a later periodic one); a fresh run checkpoints at its start and at the
`checkpoint_seconds` cadence."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wtc.errors import TrainConfigError
from wtc.models import Transformer, TransformerConfig
from wtc.models import training as T

STEPS = 12

# The child process trains what build() builds and kills itself from inside batch_fn at update
# KILL_AT (after the batch is drawn, before the optimiser step: mid-update).
CHILD = textwrap.dedent("""
    import signal, sys
    sys.path.insert(0, sys.argv[4])
    from test_training_kill import build

    _, trainer = build(sys.argv[1], kill_at=int(sys.argv[3]), sig=getattr(signal, sys.argv[2]))
    trainer.run()
    print("finished")
""")


def build(path, kill_at=None, sig=signal.SIGINT, **kw):
    model = Transformer(TransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=11,
                                          n_ctx=8), seed=1)
    rng = np.random.default_rng(0)

    def batch_fn(step):
        x = torch.from_numpy(rng.integers(0, 11, (4, 8)))
        if step == kill_at:
            os.kill(os.getpid(), sig)
        return x

    def loss_fn(x):
        logits = model(x)
        return (1 + 0.1 * torch.rand(())) * F.cross_entropy(logits[:, :-1].reshape(-1, 11), x[:, 1:].reshape(-1))

    cfg = T.TrainConfig(steps=STEPS, lr=3e-3, warmup=2, schedule="cosine", min_lr_frac=0.1)
    torch.manual_seed(5)
    trainer = T.Trainer(model, cfg, batch_fn, loss_fn, path=path, rngs={"batch": rng}, identity={"data": "x"},
                        threads=1, progress=False, **kw)
    return model, trainer


def reference(tmp_path):
    model, t = build(tmp_path / "ref" / "state")
    r = t.run()
    assert r.finished
    return model, r


def same_weights(a, b):
    for name, p in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], p), name


def resume_to_the_end(path, ref_model, ref):
    model, t = build(path)
    r = t.run()
    assert t.loaded == "resumed" and r.finished
    same_weights(ref_model, model)
    assert r.history == ref.history
    return r


@pytest.fixture
def ctrl_c_raises():
    """SIGINT as an interactive Python has it: a process a non-interactive shell starts in the
    background inherits SIGINT ignored, and a trainer rightly leaves an ignored signal alone."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_mid_update_checkpoints_the_whole_step_and_still_interrupts(tmp_path, ctrl_c_raises):
    ref_model, ref = reference(tmp_path)
    path = tmp_path / "run" / "state"
    before = signal.getsignal(signal.SIGINT)
    _, t = build(path, kill_at=6)              # SIGINT while update 6's batch is being drawn
    with pytest.raises(KeyboardInterrupt):
        t.run()
    assert signal.getsignal(signal.SIGINT) is before         # the handler of before is back
    assert T.read_state(path).step == 7        # update 6 finished, then the checkpoint, then the interrupt
    resume_to_the_end(path, ref_model, ref)


@pytest.mark.parametrize("sig, saved_step", [("SIGTERM", 7), ("SIGKILL", 0)])
def test_a_killed_training_process_resumes_and_ends_as_an_uninterrupted_run(tmp_path, sig, saved_step):
    """SIGTERM (default action: terminate) is held to the whole step, checkpointed, then terminates
    the process; SIGKILL cannot be held: the checkpoint of the run's start is what is left."""
    ref_model, ref = reference(tmp_path)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    path = tmp_path / "run" / "state"
    p = subprocess.run([sys.executable, str(script), str(path), sig, "6", os.path.dirname(__file__)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -getattr(signal, sig), p.stderr[-2000:]
    assert "finished" not in p.stdout
    st = T.read_state(path)
    assert st.step == saved_step and len(st.history["loss"]) == saved_step
    r = resume_to_the_end(path, ref_model, ref)
    assert r.seconds_per_step is not None     # it trained the rest in this call


def test_a_fresh_run_checkpoints_at_its_start_and_at_the_seconds_cadence(tmp_path, monkeypatch):
    saves = []
    real_save = T.Trainer.save
    monkeypatch.setattr(T.Trainer, "save", lambda self, path=None: (saves.append(self.step), real_save(self, path))[1])
    build(tmp_path / "a" / "state")[1].run()
    assert saves == [0, STEPS]                 # the default cadence (60 s) is not reached by 12 tiny updates
    saves.clear()
    build(tmp_path / "b" / "state", checkpoint_seconds=0)[1].run()
    assert saves == list(range(STEPS + 1))     # a cadence of 0 s: after every update
    saves.clear()
    build(None)[1].run()                       # no path: no checkpoint, no signal handling
    assert saves == []
    for bad in (-1, float("nan"), "60", True):
        with pytest.raises(TrainConfigError, match="checkpoint_seconds"):
            build(tmp_path / "c" / "state", checkpoint_seconds=bad)
