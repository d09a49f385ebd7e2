"""Discovery.save, this checkout vs an earlier engine, side by side in one run.

    python bench/save_speed.py --before /tmp/venv-before/bin/python [--task parity_last2] [--repeats 3]

Each engine discovers the task once in a fresh subprocess (same seed), then saves the result and
times the save: the first save of the process, as `wtc discover --out` does it (whatever the
save imports on first use, e.g. a plotting library, included). The two alternate, the order flipping
each repeat. Appends rows to bench/results/save_speed.csv and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_rows, cpu_flags, machine, neutral_cwd, stamp  # noqa: E402

MARK = "save: "
SCRIPT = """
import json, time, wtc
d = wtc.discover({task!r}, seed={seed}, progress=False)
t = time.perf_counter()
d.save({out!r})
print({mark!r} + json.dumps({{"seconds": time.perf_counter() - t, "solved": d.solved}}), flush=True)
"""


def timed_save(python: str, task: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([python, "-c", SCRIPT.format(task=task, seed=seed, out=out, mark=MARK)],
                              capture_output=True, text=True, cwd=neutral_cwd())
        if proc.returncode != 0:
            raise RuntimeError(f"{python}: {proc.stderr[-400:]}")
        files = sorted(p.name for p in Path(out).iterdir())
    row = next(json.loads(ln[len(MARK):]) for ln in proc.stdout.splitlines() if ln.startswith(MARK))
    return {**row, "files": files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="python of the earlier installation")
    ap.add_argument("--now", default=sys.executable, help="python of this checkout (default: this one)")
    ap.add_argument("--task", default="parity_last2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for k in range(args.repeats):
        order = ("before", "now") if k % 2 == 0 else ("now", "before")
        got = {which: timed_save(getattr(args, which), args.task, args.seed) for which in order}
        rows.append({"when": stamp(), "machine": machine(), "cpu": cpu_flags(), "task": args.task, "repeat": k,
                     "before_s": round(got["before"]["seconds"], 3), "now_s": round(got["now"]["seconds"], 3),
                     "ratio": round(got["before"]["seconds"] / got["now"]["seconds"], 1),
                     "before_files": " ".join(got["before"]["files"]), "now_files": " ".join(got["now"]["files"])})
    append_rows("save_speed", rows)
    print("| repeat | before s | now s | before/now | files now |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['repeat']} | {r['before_s']} | {r['now_s']} | {r['ratio']} | {r['now_files']} |")


if __name__ == "__main__":
    main()
