"""The CLI on hostile input: exit status 2, one line on stderr naming the problem, no traceback."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from wtc.models import Transformer, TransformerConfig
from wtc.models.io import save


def wtc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "wtc", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    cfg = TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=8, d_vocab=5, n_ctx=4)
    save(Transformer(cfg), d / "model")
    np.save(d / "tokens.npy", np.array([[0, 1, 2, 3], [3, 2, 1, 0]]))
    np.save(d / "neg.npy", np.array([[0, -1, 2, 3]]))
    np.save(d / "oov.npy", np.array([[0, 9, 2, 3]]))
    np.save(d / "long.npy", np.zeros((1, 9), np.int64))
    np.save(d / "float.npy", np.zeros((1, 4), np.float32))
    torch.save({"a": 1}, d / "dict.pt")
    (d / "garbage").mkdir()
    (d / "garbage" / "scan.sqlite").write_bytes(b"this is not a database" * 100)
    (d / "broken").mkdir()
    (d / "broken" / "model.json").write_text("{")
    (d / "broken" / "model.safetensors").write_bytes(b"junk")
    return d


CASES = {
    "unknown task": (["discover", "no_such_task"], "unknown task"),
    "budget nan": (["discover", "prev2", "--budget", "nan"], "budget"),
    "budget 0": (["train", "prev2", "--budget", "0"], "budget"),
    "steps 0": (["train", "prev2", "--steps", "0"], "positive"),
    "seed text": (["train", "prev2", "--seed", "abc"], "not a seed"),
    "missing checkpoint": (["scan", "{d}/nowhere", "--tokens", "{d}/tokens.npy", "--out", "{d}/o1"], "not a wtc transformer"),
    "broken checkpoint": (["scan", "{d}/broken", "--tokens", "{d}/tokens.npy", "--out", "{d}/o2"], "corrupt checkpoint"),
    "unknown params": (["scan", "{d}/model", "--tokens", "{d}/tokens.npy", "--params", "nope.*", "--out", "{d}/o3"],
                       "no parameter matches"),
    "negative tokens": (["scan", "{d}/model", "--tokens", "{d}/neg.npy", "--out", "{d}/o4"], "negative token id"),
    "tokens past vocab": (["scan", "{d}/model", "--tokens", "{d}/oov.npy", "--out", "{d}/o5"], "vocabulary"),
    "tokens past context": (["scan", "{d}/model", "--tokens", "{d}/long.npy", "--out", "{d}/o6"], "context"),
    "float tokens": (["scan", "{d}/model", "--tokens", "{d}/float.npy", "--out", "{d}/o7"], "integer"),
    "dict tokens": (["scan", "{d}/model", "--tokens", "{d}/dict.pt", "--out", "{d}/o8"], "token ids"),
    "mass 2": (["scan", "{d}/model", "--tokens", "{d}/tokens.npy", "--mass", "2", "--out", "{d}/o9"], "mass"),
    "unknown study": (["study", "nonsense"], "nonsense"),
    "train seed -1": (["train", "prev2", "--seed", "-1"], "non-negative"),
    "discover seed -1": (["discover", "prev2", "--seed", "-1"], "non-negative"),
    "resume without out": (["train", "prev2", "--resume"], "--out"),
    "task and all": (["discover", "prev2", "--all"], "not both"),
    "lm-train vocab 1": (["lm-train", "--vocab", "1", "--out", "{d}/lm"], "--vocab"),
    "garbage store": (["scan", "{d}/model", "--tokens", "{d}/tokens.npy", "--out", "{d}/garbage"], "not a usable scan store"),
    "lm-train heads 0": (["lm-train", "--heads", "0", "--out", "{d}/lm"], "positive"),
    "lm-train d_model 0": (["lm-train", "--d-model", "0", "--out", "{d}/lm"], "positive"),
    "out is a file": (["discover", "prev2", "--out", "{d}/tokens.npy"], "is a file, not a directory"),
    "out under a file": (["discover", "prev2", "--out", "{d}/tokens.npy/sub"], "cannot write there"),
    "out read-only": (["study", "markov", "--quick", "--out", "/proc/wtc-out"], "cannot write there"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_user_errors_are_one_line(case, checkpoint):
    args, needle = CASES[case]
    r = wtc(*[a.format(d=checkpoint) for a in args])
    assert r.returncode == 2, (case, r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("usage:")]
    assert len(lines) == 1 and "error" in lines[0] and needle in lines[0], (case, r.stderr)


def test_debug_shows_the_traceback(checkpoint):
    r = wtc("--debug", "scan", checkpoint / "model", "--tokens", checkpoint / "neg.npy", "--out", checkpoint / "o10")
    assert r.returncode != 0 and "Traceback" in r.stderr and "negative token id" in r.stderr


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_killing_discover_leaves_no_workers_running(tmp_path, how):
    """A discover killed by SIGTERM (timeout, a scheduler) or even -9 must not leave its rung
    workers training on, unseen."""
    proc = subprocess.Popen([sys.executable, "-m", "wtc", "discover", "prev2", "--quiet", "--out", str(tmp_path / "o")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    kids: list[int] = []
    while time.time() < deadline and len(kids) < 2:
        time.sleep(0.5)
        kids = _children(proc.pid)
    assert len(kids) >= 2, "the workers did not start"
    proc.send_signal(how)
    proc.wait(timeout=60)
    deadline = time.time() + 30
    while time.time() < deadline and any(_running(k) for k in kids):
        time.sleep(0.5)
    alive = [k for k in kids if _running(k)]
    assert not alive, f"workers {alive} still running after the parent got {how!r}"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_every_help_page_prints():
    """argparse %-formats help strings: a '95%' in a study's description made `wtc --help` a
    TypeError traceback. Every command's help must print, exit 0."""
    import argparse

    from wtc.cli import build_parser

    commands = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    for args in [["--help"]] + [[name, "--help"] for name in commands]:
        r = wtc(*args)
        assert r.returncode == 0 and "Traceback" not in r.stderr and "usage" in r.stdout, (args, r.stderr[-300:])


def test_the_command_exits_with_its_status_after_skipping_teardown():
    """python -m wtc ends with os._exit after flushing: the status and the whole output survive."""
    r = wtc("discover", "no_such_task")
    assert r.returncode == 2 and r.stderr.startswith("wtc: error: unknown task 'no_such_task'")
    r = wtc("tasks")
    import wtc as package
    assert r.returncode == 0 and all(name in r.stdout for name in package.tasks.names())
