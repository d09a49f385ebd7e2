"""`wtc lm-train` keeps what it says it keeps: its training state in --out (written at the start,
every minute, on Ctrl-C / SIGTERM), and a rerun of the same command resumes it and ends with the
weights an uninterrupted run ends with; a rerun with other settings is refused by name."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import torch

from wtc.cli import main
from wtc.models.io import load
from wtc.models.training import read_state

ARGS = ["lm-train", "--layers", "1", "--d-model", "16", "--heads", "2", "--vocab", "8", "--seq-len", "8",
        "--steps", "40", "--batch", "4", "--quiet"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}        # the same arithmetic as this (one-thread) test process

# The real command (wtc.cli.run: SIGTERM raises KeyboardInterrupt there), killing itself while it
# draws the batch of update KILL (mid-update).
CHILD = textwrap.dedent("""
    import os, signal, sys
    import wtc.models.lm as lm

    kill, sig = int(sys.argv[1]), getattr(signal, sys.argv[2])
    real, calls = lm.MarkovSource.sample, [0]

    def sample(self, rng, n):
        calls[0] += 1
        if calls[0] == kill + 1:
            os.kill(os.getpid(), sig)
        return real(self, rng, n)

    lm.MarkovSource.sample = sample
    sys.argv = ["wtc"] + sys.argv[3:]
    from wtc.cli import run
    run()
""")


def reference(tmp_path):
    assert main(ARGS + ["--out", str(tmp_path / "ref")]) == 0
    return load(tmp_path / "ref" / "model")


def same_result(tmp_path, out):
    ref = reference(tmp_path)
    model = load(out / "model")
    for name, p in ref.state_dict().items():
        assert torch.equal(model.state_dict()[name], p), name
    assert np.array_equal(np.load(out / "tokens.npy"), np.load(tmp_path / "ref" / "tokens.npy"))
    assert read_state(out / "train_state").history == read_state(tmp_path / "ref" / "train_state").history


def test_sigterm_mid_update_checkpoints_that_step_says_so_and_a_rerun_resumes(tmp_path, capsys):
    script, out = tmp_path / "child.py", tmp_path / "run"
    script.write_text(CHILD)
    p = subprocess.run([sys.executable, str(script), "5", "SIGTERM", *ARGS, "--out", str(out)], capture_output=True,
                       text=True, timeout=300, env=ENV)
    assert p.returncode == 130, p.stderr[-2000:]
    assert f"training state at step 6 kept in {out / 'train_state'}" in p.stderr
    assert "run the same command again to resume" in p.stderr
    assert read_state(out / "train_state").step == 6 and not (out / "model").exists()
    assert main(["lm-train", *ARGS[1:-1], "--batch", "5", "--out", str(out)]) == 2       # other settings
    err = capsys.readouterr().err
    assert "cannot resume" in err and "'batch'" in err
    assert main(ARGS + ["--out", str(out)]) == 0
    same_result(tmp_path, out)


def test_an_external_kill_9_after_the_first_checkpoint_leaves_a_resumable_run(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "wtc", *ARGS, "--out", str(out)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not (out / "train_state.json").exists() and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=300)
    assert (out / "train_state.json").exists(), proc.stderr.read()[-2000:]
    assert read_state(out / "train_state").step <= 40     # whatever it reached: a readable checkpoint
    assert main(ARGS + ["--out", str(out)]) == 0
    same_result(tmp_path, out)
