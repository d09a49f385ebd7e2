"""`wtc discover` end to end, this checkout vs an earlier engine, side by side in one run.

    python bench/discover_speed.py --before /tmp/venv-before/bin/python [--tasks parity_last2,prev2]
                                   [--callables window5,max5,count_mod3_c,rose_c,dps_c] [--budget 300]

The earlier engine is another installation of wtc (e.g. `git worktree add /tmp/before <commit>`,
then a venv with `--system-site-packages` and `pip install --no-deps -e /tmp/before`); its
interpreter is given with --before. Each task is discovered by both, alternately (the order flips
from task to task, so slow drift of a shared machine hits both), as a user runs it: `python -m wtc
discover TASK --seed S --out DIR` in a subprocess, timed by wall clock. Recorded per run: seconds,
solved, attempts, and the program's source; "same program" compares the two sources. Appends rows
to bench/results/discover_speed.csv and prints a markdown table with the ratio before / now.

--callables: tasks declared the way a user declares them, `wtc.Task(name, sample, target, ...)`
with lambdas (CALLABLES below: a window, an extremum, a modular counter, a detector and a double
prefix sum, restated from the wider suite under other names so no engine knows them), each run by
`wtc.discover(task, ...)` in a subprocess script and saved with Discovery.save. The cpu / wall
ratio of those rows says whether a callable task used both cores: over the whole script
(interpreter start, imports, saving and exit included) and over the wtc.discover call alone
(*_call_* columns: its lazy imports included).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_rows, cpu_flags, machine, neutral_cwd, stamp  # noqa: E402

MUST = ["parity_last2", "sum_last2", "prev2", "max_last3", "min_last2", "diff_prev", "product_last2",
        "first_value", "xor_pair", "and_prev", "select_by_flag", "ema3", "linear_combo", "nonlinear_combo",
        "relu_diff", "free_fall_height", "free_fall_next"]


ENV_SHOWN = ("ATEN_CPU_CAPABILITY", "WTC_NATIVE_ISA", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def _children_cpu() -> float:
    """User + system CPU seconds of every waited-for child process and its descendants (the
    discover workers): less sensitive than wall time to other jobs on a shared machine."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def discover(python: str, task: str, seed: int, out: Path, budget: float | None) -> dict:
    cmd = [python, "-m", "wtc", "discover", task, "--seed", str(seed), "--out", str(out), "--quiet"]
    if budget:
        cmd += ["--budget", str(budget)]
    t0, c0 = time.perf_counter(), _children_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=neutral_cwd())
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - c0
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    source = (out / "program.py").read_text() if (out / "program.py").exists() else ""
    return {"seconds": seconds, "cpu": cpu, "load": os.getloadavg()[0], "solved": bool(summary.get("solved")), "attempts": len(summary.get("attempts", [])),
            "source": source, "exit": proc.returncode, "stderr": proc.stderr[-400:]}


CALLABLES = """
import numpy as np
import wtc

def _window(x, w, reduce):
    T = x.shape[1]
    return np.stack([reduce(x[:, max(0, t - w + 1): t + 1], axis=1) for t in range(T)], axis=1)

def _prev(x):
    out = np.zeros_like(x)
    out[:, 1:] = x[:, :-1]
    return out

TASKS = {
    "window5": wtc.Task("window5", lambda rng, n: rng.integers(0, 10, (n, 10)), lambda x: _window(x, 5, np.sum),
                        seq_len=10, any_length=True, description="sum of the last five values"),
    "max5": wtc.Task("max5", lambda rng, n: rng.integers(0, 100, (n, 10)), lambda x: _window(x, 5, np.max),
                     seq_len=10, any_length=True, description="maximum of the last five values that exist"),
    "count_mod3_c": wtc.Task("count_mod3_c", lambda rng, n: rng.integers(0, 2, (n, 10)),
                             lambda x: np.cumsum(x, axis=1) % 3, seq_len=10, any_length=True,
                             description="number of ones so far, modulo 3"),
    "rose_c": wtc.Task("rose_c", lambda rng, n: rng.integers(0, 100, (n, 10)), lambda x: (x > _prev(x)).astype(int),
                       seq_len=10, any_length=True, description="1 if the value rose"),
    "dps_c": wtc.Task("dps_c", lambda rng, n: rng.integers(0, 3, (n, 10)),
                      lambda x: np.cumsum(np.cumsum(x, axis=1), axis=1), seq_len=10, any_length=True,
                      description="prefix sum of the prefix sum"),
}
"""


def program_body(source: str) -> str:
    """The computation of a program.py: the lines from `T = len(xs)` on (later engines write a
    DOMAIN record and its check before them; "same program" compares what is computed)."""
    lines = source.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "T = len(xs)"), 0)
    return "\n".join(lines[start:])


CALL_MARK = "discover call: "
# the script's own clock around the wtc.discover call (its lazy imports of torch and the engine
# included; the interpreter's start, the save and the exit not): CPU of this process and of the
# workers it reaped, over the call's wall time
CALL_TIMED = """
import json, resource, time

def _cpu():
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))

_w, _c = time.perf_counter(), _cpu()
d = wtc.discover(TASKS[{task!r}], seed={seed}, budget_s={budget!r}, progress=False)
print({mark!r} + json.dumps({{"seconds": time.perf_counter() - _w, "cpu": _cpu() - _c}}), flush=True)
d.save({out!r})
"""


def discover_callable(python: str, task: str, seed: int, out: Path, budget: float | None) -> dict:
    """One of CALLABLES discovered by `python` as a user script would: wtc.discover(task), saved."""
    script = CALLABLES + CALL_TIMED.format(task=task, seed=seed, budget=budget, out=str(out), mark=CALL_MARK)
    t0, c0 = time.perf_counter(), _children_cpu()
    proc = subprocess.run([python, "-c", script], capture_output=True, text=True, cwd=neutral_cwd())
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - c0
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    source = (out / "program.py").read_text() if (out / "program.py").exists() else ""
    call = next((json.loads(ln[len(CALL_MARK):]) for ln in proc.stdout.splitlines() if ln.startswith(CALL_MARK)),
                {"seconds": float("nan"), "cpu": float("nan")})
    return {"seconds": seconds, "cpu": cpu, "load": os.getloadavg()[0], "solved": bool(summary.get("solved")),
            "attempts": len(summary.get("attempts", [])), "source": source, "exit": proc.returncode,
            "stderr": proc.stderr[-400:], "call": call}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="python of the earlier installation")
    ap.add_argument("--now", default=sys.executable, help="python of this checkout (default: this one)")
    ap.add_argument("--tasks", default=",".join(MUST), help="comma-separated task names (default: the must tasks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--csv", default="discover_speed_s21", help="bench/results/<csv>.csv to append to")
    ap.add_argument("--callables", default="", help="comma-separated CALLABLES to run too (e.g. window5,max5)")
    args = ap.parse_args()
    rows = []
    jobs = [(t, discover) for t in args.tasks.split(",") if t] + [(t, discover_callable)
                                                                  for t in args.callables.split(",") if t]
    with tempfile.TemporaryDirectory(prefix="wtc-discover-speed-") as tmp:
        for i, (task, run) in enumerate(jobs):
            order = [("before", args.before), ("now", args.now)]
            runs = {}
            for label, python in (order if i % 2 == 0 else order[::-1]):
                runs[label] = run(python, task, args.seed, Path(tmp) / f"{task}-{label}", args.budget)
            b, n = runs["before"], runs["now"]
            row = {"when": stamp(), "machine": machine(), "cpu": cpu_flags(),
                   "env": " ".join(f"{k}={os.environ[k]}" for k in ENV_SHOWN if k in os.environ) or "-",
                   "task": task, "seed": args.seed,
                   "before_s": round(b["seconds"], 1), "now_s": round(n["seconds"], 1),
                   "speedup": round(b["seconds"] / n["seconds"], 2), "before_cpu_s": round(b["cpu"], 1),
                   "now_cpu_s": round(n["cpu"], 1), "load": round((b["load"] + n["load"]) / 2, 1),
                   "declared": "callables" if run is discover_callable else "built-in",
                   "before_cpu_per_wall": round(b["cpu"] / b["seconds"], 2),
                   "now_cpu_per_wall": round(n["cpu"] / n["seconds"], 2),
                   "before_solved": b["solved"],
                   "now_solved": n["solved"], "before_attempts": b["attempts"], "now_attempts": n["attempts"],
                   "same_program": program_body(b["source"]) == program_body(n["source"]) and bool(n["source"])}
            if "call" in n:                       # the discover call alone (CALL_TIMED)
                row.update({f"{k}_call_{m}": round(runs[k]["call"][m] if m != "cpu_per_wall" else
                                                   runs[k]["call"]["cpu"] / runs[k]["call"]["seconds"], 2)
                            for k in ("before", "now") for m in ("seconds", "cpu_per_wall")})
            rows.append(row)
            append_rows(args.csv, [row])          # kept as it comes: a long run can be stopped
            print(json.dumps(row), flush=True)
            for label, r in runs.items():
                if r["exit"] not in (0, 1):
                    print(f"  {label} exited {r['exit']}: {r['stderr']}", flush=True)
    print("\n| task | declared | before s | now s | before/now | cpu/wall (before, now) | discover call cpu/wall "
          "(before, now) | solved (before, now) | attempts (before, now) | same program |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        call = f"{r['before_call_cpu_per_wall']}, {r['now_call_cpu_per_wall']}" if "now_call_seconds" in r else "-"
        print(f"| {r['task']} | {r['declared']} | {r['before_s']} | {r['now_s']} | {r['speedup']} | "
              f"{r['before_cpu_per_wall']}, {r['now_cpu_per_wall']} | {call} | {r['before_solved']}, "
              f"{r['now_solved']} | {r['before_attempts']}, {r['now_attempts']} | {r['same_program']} |")


if __name__ == "__main__":
    main()
