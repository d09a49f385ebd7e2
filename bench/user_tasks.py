"""Tasks a user brings, declared as a user declares them (wtc.Task with lambdas), through
`wtc.discover` at a budget: running extremes, "seen so far" and "still sorted" predicates, the
first value, the last non-zero, a new record, the range so far, the distance to the last 1, the
count of distinct values, a count mod 12 and the dozens a running total crosses (error diffusion by 12). One JSON per task under --out (a rerun skips the tasks already there:
resumable), then a table: solved, seconds, attempts, the program's body.

    python bench/user_tasks.py --budget 240 --out bench/results/user_tasks/<run>
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_flags, machine, stamp  # noqa: E402

import wtc  # noqa: E402
from wtc.provenance import source_revision  # noqa: E402

T = 10


def _digits(k: int):
    return lambda rng, n: rng.integers(0, k, size=(n, T))


def _last_nonzero(x):
    out = np.zeros_like(x)
    for t in range(x.shape[1]):
        out[:, t] = np.where(x[:, t] != 0, x[:, t], out[:, t - 1] if t else 0)
    return out


def _since_last_one(x):
    out = np.zeros_like(x)
    for t in range(x.shape[1]):
        out[:, t] = np.where(x[:, t] == 1, 0, (out[:, t - 1] if t else 0) + 1)
    return out


TASKS = {
    "running_max": (_digits(10), lambda x: np.maximum.accumulate(x, axis=1)),
    "running_min": (_digits(10), lambda x: np.minimum.accumulate(x, axis=1)),
    "seen_three": (_digits(5), lambda x: np.maximum.accumulate(x == 3, axis=1).astype(int)),
    "first_value": (_digits(10), lambda x: np.repeat(x[:, :1], x.shape[1], axis=1)),
    "last_nonzero": (_digits(4), _last_nonzero),
    "sorted_so_far": (_digits(4), lambda x: np.concatenate(
        [np.ones((len(x), 1), int), np.minimum.accumulate(x[:, 1:] >= x[:, :-1], axis=1)], axis=1)),
    "new_record": (_digits(10), lambda x: np.concatenate(
        [np.ones((len(x), 1), int), x[:, 1:] > np.maximum.accumulate(x, axis=1)[:, :-1]], axis=1).astype(int)),
    "range_so_far": (_digits(10), lambda x: np.maximum.accumulate(x, axis=1) - np.minimum.accumulate(x, axis=1)),
    "since_last_one": (_digits(2), _since_last_one),
    "count_distinct": (_digits(4), lambda x: np.stack([np.array([len(set(r[:t + 1])) for r in x])
                                                       for t in range(x.shape[1])], axis=1)),
    "count_mod12": (_digits(4), lambda x: np.cumsum(x, axis=1) % 12),
    "dozens_crossed": (_digits(13), lambda x: np.diff(np.cumsum(x, axis=1) // 12, axis=1, prepend=0)),
}


def body(source: str) -> str:
    """The program's loop and lines, without the domain check every program carries."""
    start = source.find("    T = len(xs)")
    return source[start:] if start >= 0 else source


def run(name: str, budget: float, seed: int) -> dict:
    sample, target = TASKS[name]
    task = wtc.Task(name, sample, target, seq_len=T, any_length=True)
    t0 = time.time()
    d = wtc.discover(task, seed=seed, budget_s=budget, progress=False)
    return {"task": name, "solved": bool(d.solved), "seconds": round(time.time() - t0, 1),
            "attempts": len(d.attempts), "budget_s": budget, "seed": seed,
            "program": None if d.program is None else body(d.program.source),
            "verification": None if d.verification is None else str(d.verification)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--budget", type=float, default=240.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    unknown = [n for n in a.tasks.split(",") if n not in TASKS]
    if unknown:                              # before anything is written
        sys.exit(f"unknown task {unknown[0]!r}; known: {', '.join(TASKS)}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.json").write_text(json.dumps({"machine": machine(), "cpu_flags": cpu_flags(), "date": stamp(),
                                                  "wtc": wtc.__version__, "source": source_revision()}, indent=2))
    for name in a.tasks.split(","):
        path = out / f"{name}.json"
        if path.exists():
            continue
        row = run(name, a.budget, a.seed)
        path.write_text(json.dumps(row, indent=1))
        print(f"{name}: {'solved' if row['solved'] else 'not solved'} in {row['seconds']} s, "
              f"{row['attempts']} attempt(s)", flush=True)
    rows = [json.loads((out / f"{n}.json").read_text()) for n in TASKS if (out / f"{n}.json").exists()]
    lines = ["| task | solved | seconds | attempts |", "|---|---|---|---|"]
    lines += [f"| {r['task']} | {'yes' if r['solved'] else 'no'} | {r['seconds']} | {r['attempts']} |" for r in rows]
    (out / "results.md").write_text("\n".join(lines) + "\n\n" + "\n".join(
        f"## {r['task']}\n\n```python\n{r['program'] or '(none)'}```\n" for r in rows))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
