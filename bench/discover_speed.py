"""`wtc discover` end to end, this checkout vs an earlier engine, side by side in one run.

    python bench/discover_speed.py --before /tmp/venv-before/bin/python [--tasks parity_last2,prev2]

The earlier engine is another installation of wtc (e.g. `git worktree add /tmp/before <commit>`,
then a venv with `--system-site-packages` and `pip install --no-deps -e /tmp/before`); its
interpreter is given with --before. Each task is discovered by both, alternately (the order flips
from task to task, so slow drift of a shared machine hits both), as a user runs it: `python -m wtc
discover TASK --seed S --out DIR` in a subprocess, timed by wall clock. Recorded per run: seconds,
solved, attempts, and the program's source; "same program" compares the two sources. Appends rows
to bench/results/discover_speed.csv and prints a markdown table with the ratio before / now.
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
from common import append_rows, machine, stamp  # noqa: E402

MUST = ["parity_last2", "sum_last2", "prev2", "max_last3", "min_last2", "diff_prev", "product_last2",
        "first_value", "xor_pair", "and_prev", "select_by_flag", "ema3", "linear_combo", "nonlinear_combo",
        "relu_diff", "free_fall_height", "free_fall_next"]


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
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - c0
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    source = (out / "program.py").read_text() if (out / "program.py").exists() else ""
    return {"seconds": seconds, "cpu": cpu, "load": os.getloadavg()[0], "solved": bool(summary.get("solved")), "attempts": len(summary.get("attempts", [])),
            "source": source, "exit": proc.returncode, "stderr": proc.stderr[-400:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="python of the earlier installation")
    ap.add_argument("--now", default=sys.executable, help="python of this checkout (default: this one)")
    ap.add_argument("--tasks", default=",".join(MUST), help="comma-separated task names (default: the must tasks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="wtc-discover-speed-") as tmp:
        for i, task in enumerate(args.tasks.split(",")):
            order = [("before", args.before), ("now", args.now)]
            runs = {}
            for label, python in (order if i % 2 == 0 else order[::-1]):
                runs[label] = discover(python, task, args.seed, Path(tmp) / f"{task}-{label}", args.budget)
            b, n = runs["before"], runs["now"]
            row = {"when": stamp(), "machine": machine(), "task": task, "seed": args.seed,
                   "before_s": round(b["seconds"], 1), "now_s": round(n["seconds"], 1),
                   "speedup": round(b["seconds"] / n["seconds"], 2), "before_cpu_s": round(b["cpu"], 1),
                   "now_cpu_s": round(n["cpu"], 1), "load": round((b["load"] + n["load"]) / 2, 1),
                   "before_solved": b["solved"],
                   "now_solved": n["solved"], "before_attempts": b["attempts"], "now_attempts": n["attempts"],
                   "same_program": b["source"] == n["source"] and bool(n["source"])}
            rows.append(row)
            append_rows("discover_speed", [row])          # kept as it comes: a long run can be stopped
            print(json.dumps(row), flush=True)
            for label, r in runs.items():
                if r["exit"] not in (0, 1):
                    print(f"  {label} exited {r['exit']}: {r['stderr']}", flush=True)
    print("\n| task | before s | now s | before/now | solved (before, now) | attempts (before, now) | same program |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r['before_s']} | {r['now_s']} | {r['speedup']} | {r['before_solved']}, "
              f"{r['now_solved']} | {r['before_attempts']}, {r['now_attempts']} | {r['same_program']} |")


if __name__ == "__main__":
    main()
