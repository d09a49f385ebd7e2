"""`wtc discover` on the wider suite (tier "wider"), as a user runs it, one task after another.

    python bench/wider_suite.py [--tasks sum_last5,is_even] [--budget 600] [--seed 0]

Each task runs as `python -m wtc discover TASK --seed S --budget B --out DIR --quiet` in a
subprocess, timed by wall clock; recorded: seconds, solved, attempts, program lines, what the
probe found the target reads, and the program's source. Rows go to bench/results/wider_suite.jsonl
(one JSON object per run); a task already recorded for this seed and budget is skipped, so the
suite can run in pieces (--again reruns it; the newest row counts). Prints the markdown table for the README.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, neutral_cwd, stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "wider_suite.jsonl"


def run(task: str, seed: int, budget: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / task
        cmd = [sys.executable, "-m", "wtc", "discover", task, "--seed", str(seed), "--budget", str(budget),
               "--out", str(out), "--quiet"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=neutral_cwd())
        seconds = time.perf_counter() - t0
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
        source = (out / "program.py").read_text() if (out / "program.py").exists() else ""
    return {"task": task, "seed": seed, "budget": budget, "seconds": round(seconds, 1),
            "solved": bool(summary.get("solved")), "attempts": len(summary.get("attempts", [])),
            "program_lines": summary.get("program_lines"), "depends_on": summary.get("depends_on"),
            "failures": summary.get("failures", []), "exit": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:] if proc.returncode > 1 else [],
            "source": source, "date": stamp(), "machine": machine()}


def output_line(source: str) -> str:
    """The program's output expression(s), as the source writes them (`x[t]` read as `x`)."""
    found = re.findall(r"out\.append\(float\((.*)\)\)$|out\.append\(\[(.*)\]\)$", source, flags=re.M)
    parts = [a or b for a, b in found]
    return "; ".join("`" + p.replace("[t]", "") + "`" for p in parts) or "-"


def main() -> None:
    import wtc

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=None, help="comma-separated names (default: every 'wider' task)")
    p.add_argument("--budget", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--again", action="store_true", help="rerun tasks already recorded (the engine changed)")
    p.add_argument("--table", action="store_true", help="print the table of what is recorded; run nothing")
    a = p.parse_args()
    names = a.tasks.split(",") if a.tasks else wtc.tasks.names(tier="wider")
    done = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines():
            row = json.loads(line)
            done[(row["task"], row["seed"], row["budget"])] = row
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        if a.table or ((name, a.seed, a.budget) in done and not a.again):
            continue
        row = run(name, a.seed, a.budget)
        done[(name, a.seed, a.budget)] = row
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{name:18s} {'solved' if row['solved'] else 'NOT solved':10s} {row['seconds']:7.1f}s "
              f"{row['attempts']} attempt(s)", flush=True)
    rows = [done[(n, a.seed, a.budget)] for n in names if (n, a.seed, a.budget) in done]
    print("\n| task | solved | seconds | attempts | program lines | output line |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {'yes' if r['solved'] else 'no'} | {r['seconds']:.0f} | {r['attempts']} | "
              f"{r['program_lines'] or '-'} | {output_line(r['source']) if r['solved'] else '-'} |")
    solved = sum(r["solved"] for r in rows)
    print(f"\n{solved}/{len(rows)} solved")


if __name__ == "__main__":
    main()
