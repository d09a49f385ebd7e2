"""Runs that say what they are, and tasks from files (issue 38, items 3 and 4).

`wtc --version`; `wtc train|discover FILE.py:NAME` (and --module MODULE:NAME) from a shell, with
one-line errors naming what is wrong; summary.json records the version, seed, config, task
fingerprint and machine; the program and report on stdout, progress on stderr through the "wtc"
logger (--quiet / --verbose; off a terminal, occasional lines and no carriage returns); a model
loaded from disk refuses extraction against another task than the one it learned."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import wtc
from wtc import machine, progress
from wtc.cli import main
from wtc.dt.config import DTConfig
from wtc.extraction.reader import ExtractionInputError
from wtc.tasks import TaskError
from wtc.tasks.files import resolve

TASK_FILE = '''
import numpy as np
import wtc


def _sum2(x):
    prev = np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
    return x + prev


my_sum = wtc.Task("my_sum", lambda rng, n: rng.integers(0, 5, (n, 6)), _sum2, seq_len=6)
other = wtc.Task("renamed_inside", lambda rng, n: rng.integers(0, 5, (n, 6)), lambda x: 2 * x, seq_len=6)
helper = 3
'''

TINY = DTConfig(n_layers=1, n_heads=1, n_mlps=1, mlp_hidden=8, steps=30, hard_steps=5, polish_iters=5,
                replicas=2, max_attempts=1, batch_size=16, eval_sequences=64, precision_iters=0, workers=1,
                grow=False)


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "tasks.py"
    path.write_text(TASK_FILE)
    return path


def _wtc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "wtc", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "WTC_DEBUG": ""}, cwd=cwd, timeout=900)


def _run_fields(summary: dict, task, seed: int) -> None:
    """summary.json says what the run was: version, seed, config, task fingerprint, machine."""
    assert summary["wtc_version"] == wtc.__version__
    assert summary["seed"] == seed
    assert DTConfig.from_dict(summary["config"]) is not None
    assert summary["task_sha256"] == task.fingerprint()
    m = summary["machine"]
    assert m["cpu_flags"] == machine.cpu_flags() and m["cpu_model"] == machine.cpu_model()
    assert m["logical_cores"] >= 1 and m["python"] and m["system"]
    assert summary["started"].endswith("+00:00")
    root = Path(wtc.__file__).resolve().parent.parent
    if (root / ".git").exists():          # a checkout: the commit it ran from (CI and here); a wheel: None
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        assert summary["wtc_source"].split("+")[0] == head
    else:
        assert summary["wtc_source"] is None


# ---------------------------------------------------------------------- --version
def test_version_prints_the_installed_version():
    r = _wtc("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"wtc {wtc.__version__}"
    assert wtc.__version__ == metadata.version("wtc")          # the package's and the installed metadata agree


# ---------------------------------------------------------------------- tasks from files
def test_resolve_finds_a_task_by_variable_by_its_name_and_alone(tmp_path, task_file, monkeypatch):
    t = resolve(f"{task_file}:my_sum")
    assert isinstance(t, wtc.Task) and t.name == "my_sum"
    assert resolve(f"{task_file}:my_sum") is t                  # the file runs once, not per lookup
    assert resolve(f"{task_file}:renamed_inside").name == "renamed_inside"   # the Task's own name
    with pytest.raises(TaskError, match=r"defines 2 wtc.Tasks \(my_sum, other\); name one"):
        resolve(str(task_file))
    single = tmp_path / "one.py"
    single.write_text("import wtc\nt = wtc.Task('only', lambda rng, n: rng.integers(0, 3, (n, 4)), "
                      "lambda x: x, seq_len=4)\n")
    assert resolve(str(single)).name == "only"
    pkg = tmp_path / "mytasks_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "defs.py").write_text(TASK_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve("mytasks_pkg.defs:my_sum", module=True).name == "my_sum"
    assert resolve("sum_last2") is wtc.tasks.get("sum_last2")


def test_the_readmes_task_file_defines_the_task_it_says(tmp_path):
    """The README's shell example (`wtc discover tasks.py:my_sum3`): its tasks.py resolves to a valid
    task computing x_t + x_{t-1} + x_{t-2}."""
    import re

    import numpy as np

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "my_sum3 = wtc.Task" in b)
    (tmp_path / "tasks.py").write_text(block)
    assert "wtc discover tasks.py:my_sum3" in readme
    task = resolve(f"{tmp_path}/tasks.py:my_sum3")
    x = task.sample(np.random.default_rng(0), 50)
    want = x + np.pad(x, ((0, 0), (1, 0)))[:, :-1] + np.pad(x, ((0, 0), (2, 0)))[:, :-2]
    assert np.array_equal(task.target(x), want) and len(task.fingerprint()) == 64


@pytest.mark.parametrize("argv, message", [
    (["discover", "{dir}/missing.py:my_sum"], "no task file '{dir}/missing.py'"),
    (["discover", "{dir}/tasks.py:nope"], "{dir}/tasks.py has no task 'nope' (its wtc.Tasks: my_sum, other)"),
    (["train", "{dir}/tasks.py:helper"], "'helper' in {dir}/tasks.py is of type int, not a wtc.Task"),
    (["discover", "{dir}/broken.py:t"], "task file '{dir}/broken.py' raised ZeroDivisionError"),
    (["discover", "{dir}/tasks.txt:my_sum"], "'{dir}/tasks.txt' is not a .py file"),
    (["discover", "pkg.mod:my_sum"], "for a task in an importable module give --module pkg.mod:my_sum"),
    (["discover", "--module", "no_such_module_wtc:my_sum"], "no module 'no_such_module_wtc' to import"),
    (["train", "--module", "no_colon"], "--module takes MODULE:NAME"),
    (["discover", "{dir}/tasks.py:my_sum", "--module", "a.b:c"], "give a TASK or --module, not both"),
    (["train"], "give a TASK (a name, or FILE.py:NAME) or --module MODULE:NAME"),
    (["discover", "no_such_task_name"], "unknown task 'no_such_task_name'"),
])
def test_a_bad_task_spec_is_one_line_naming_what_is_wrong(tmp_path, task_file, capsys, argv, message):
    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    (tmp_path / "tasks.txt").write_text(TASK_FILE)
    code = main([a.format(dir=tmp_path) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("wtc: error: ") and message.format(dir=tmp_path) in err


def test_train_from_a_task_file_in_a_shell(tmp_path, task_file):
    """The README's shell example: a task defined in a file, run by `wtc train FILE.py:NAME` in a fresh
    process (a registry lives in one process only). The result on stdout, progress on stderr, no
    carriage returns in piped output, and summary.json says what the run was."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "training.png").write_bytes(b"an earlier version's chart")   # the chart is training.svg now
    r = _wtc("train", f"{task_file}:my_sum", "--steps", 30, "--replicas", 2, "--attempts", 1, "--seed", 3,
             "--out", out, cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("my_sum: accuracy = ") and lines[1].startswith("structure: ")
    assert lines[2].startswith("wrote ") and len(lines) == 3                 # no progress on stdout
    assert "my_sum attempt 0: " in r.stderr and "replicas solved" in r.stderr
    assert "\r" not in r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    _run_fields(summary, resolve(f"{task_file}:my_sum"), seed=3)
    assert summary["config"]["steps"] == 30 and summary["config"]["replicas"] == 2
    assert (out / "training.svg").is_file() and not (out / "training.png").exists()


def test_quiet_silences_progress_and_keeps_the_result(task_file, capsys):
    code = main(["train", f"{task_file}:my_sum", "--steps", "20", "--replicas", "1", "--attempts", "1",
                 "--budget", "3", "--quiet"])
    out, err = capsys.readouterr()
    assert code in (0, 1) and out.startswith("my_sum: ")
    assert err == ""


def test_progress_from_python_goes_to_stderr():
    """progress=True from a script: lines on stderr (no logging configured: wtc gives its logger a
    stderr handler), the script's own output alone on stdout."""
    code = textwrap.dedent("""
        import wtc
        from wtc.dt.config import DTConfig
        cfg = DTConfig(n_heads=1, n_mlps=1, mlp_hidden=8, steps=20, hard_steps=5, polish_iters=2, precision_iters=0,
                       replicas=1, max_attempts=1, workers=1, batch_size=16, eval_sequences=64, grow=False)
        wtc.train("prev2", cfg, progress=True)
        print("done")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "done\n"
    assert "prev2 attempt 0: " in r.stderr and "\r" not in r.stderr


def test_discover_records_the_run_and_saves_it(tmp_path, task_file):
    task = resolve(f"{task_file}:my_sum")
    d = wtc.discover(task, seed=5, config=TINY, budget_s=120, progress=False)
    assert d.run is not None and d.run.task == "my_sum"
    d.save(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    _run_fields(summary, task, seed=5)
    assert summary["config"]["steps"] == TINY.steps          # the configuration the first attempt ran


@pytest.mark.slow
def test_discover_a_task_file_from_a_shell(tmp_path, task_file):
    out = tmp_path / "run"
    r = _wtc("discover", f"{task_file}:my_sum", "--budget", 20, "--out", out, cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert "my_sum attempt 0" in r.stderr and "my_sum attempt" not in r.stdout
    assert r.stdout.rstrip().endswith(f"wrote {out}/program.py, report.md, training.svg, summary.json, model/")
    assert "\r" not in r.stdout + r.stderr
    _run_fields(json.loads((out / "summary.json").read_text()), resolve(f"{task_file}:my_sum"), seed=0)


# ---------------------------------------------------------------------- a loaded model knows its task
def test_a_loaded_model_refuses_another_task(tmp_path):
    from wtc.dt import checkpoint

    model, _ = wtc.train("prev2", TINY, progress=False)
    checkpoint.save(model, tmp_path / "model", extra=model.train_info)
    loaded = wtc.load(tmp_path / "model")
    assert loaded.train_info["task"] == "prev2"
    base = wtc.tasks.get("prev2")
    shifted = wtc.Task("prev2_plus_one", base.sample, lambda x: base.target(x) + 1, seq_len=base.seq_len,
                       n_inputs=base.n_inputs, output=base.output)
    with pytest.raises(ExtractionInputError, match=r"trained on task 'prev2', not on 'prev2_plus_one' \(task "
                                                   r"fingerprints [0-9a-f]{12} and [0-9a-f]{12} differ\)"):
        wtc.extract(loaded, shifted)
    # task_check="warn" warns and goes on to the next checks (a longer task: the shape check refuses it,
    # cheaply; reading the model out is not what is tested here)
    longer = wtc.Task("prev2_longer", lambda rng, n: rng.integers(0, 5, (n, base.seq_len + 1)),
                      lambda x: x, seq_len=base.seq_len + 1, n_inputs=base.n_inputs, output=base.output)
    with pytest.warns(UserWarning, match="trained on task 'prev2', not on 'prev2_longer'"):
        with pytest.raises(ExtractionInputError, match="does not match task 'prev2_longer'"):
            wtc.extract(loaded, longer, task_check="warn")
    with pytest.raises(ExtractionInputError, match="task_check must be 'error' or 'warn'"):
        wtc.extract(loaded, base, task_check="maybe")


# ---------------------------------------------------------------------- progress lines
class _Clock:
    def __init__(self, step_s: float):
        self.now, self.step_s = 1000.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


@pytest.fixture
def info_logs(caplog):
    caplog.set_level(logging.INFO, logger="wtc")
    return caplog


def test_steps_off_a_terminal_are_occasional_lines(monkeypatch, info_logs):
    monkeypatch.setattr(progress.time, "monotonic", _Clock(0.1))      # 1000 steps = 100 s of fake time
    bar = progress.Steps(1000, 0, "demo attempt 0", True)
    assert bar.bar is None                                            # pytest's stderr is no terminal
    for step in range(1, 1001):
        bar.update(step, "loss=1" if step % 50 == 0 else None)
    bar.close()
    lines = [r.getMessage() for r in info_logs.records]
    assert len(lines) == int(100 / progress.LINE_EVERY_S)            # one line per LINE_EVERY_S, not per step
    assert all(line.startswith("demo attempt 0: step ") and "\r" not in line for line in lines)
    assert "(15%)" in lines[0] or "(14%)" in lines[0]


def test_steps_in_a_worker_report_records_for_the_parent(monkeypatch, capsys, info_logs):
    monkeypatch.setattr(progress.time, "monotonic", _Clock(0.25))
    bar = progress.Steps(40, 0, "demo attempt 1", "worker", key="attempt 1")
    for step in range(1, 41):
        bar.update(step)
    bar.close()
    out = capsys.readouterr().out.splitlines()
    assert all(line.startswith(progress.STATUS) for line in out) and len(out) == 10 + 1   # every 1 s, and the end
    assert json.loads(out[-1][len(progress.STATUS):]) == {"key": "attempt 1", "step": 40, "total": 40}
    assert not info_logs.records                                     # the parent shows them, not the worker
    monkeypatch.setattr(progress.time, "monotonic", _Clock(progress.LINE_EVERY_S))
    board = progress.Board("demo", True)
    board.line(f"{progress.MILESTONE}demo attempt 1: training")
    board.line(out[3])
    board.line("a worker's own print")
    board.tick()
    board.close()
    assert [r.getMessage() for r in info_logs.records][0] == "demo attempt 1: training"
    assert info_logs.records[1].getMessage().startswith("demo: attempt 1 step 16/40 | ")


def test_progress_off_says_nothing(capsys, info_logs):
    bar = progress.Steps(10, 0, "x", False)
    for step in range(10):
        bar.update(step)
    bar.close()
    progress.say(False, "hidden")
    assert capsys.readouterr() == ("", "") and not info_logs.records


def test_command_logging_levels_and_restores_the_logger(capsys):
    log = logging.getLogger("wtc")
    before = (log.level, log.propagate, list(log.handlers))
    with progress.command_logging("quiet"):
        log.info("progress line")
        log.warning("a warning")
    with progress.command_logging("verbose"):
        log.debug("a detail")
        log.info("another line")
    assert (log.level, log.propagate, list(log.handlers)) == before
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["wtc: warning: a warning", "wtc: debug: a detail", "another line"]
    with pytest.raises(ValueError, match="verbosity"):
        with progress.command_logging("loud"):
            pass
