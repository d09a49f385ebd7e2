"""The vote reading (wtc.extraction.argmax) on prefix counts of MIPS tasks' inputs: read_argmax as it
is (a 300-row screen, then fits with misfits cheap first) beside one full linear program over every
distinct row with misfits dear (the first version's path, without its time limit), in one run.

    python bench/argmax_speed.py [--tasks Add_Mod_6,Majority_0_2,...] [--full-limit 300]

Counts are those of 2048 draws of each task (decisions: the task's own targets). Appends rows to
bench/results/argmax_speed.csv and prints a markdown table.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_rows, cpu_flags, machine, stamp  # noqa: E402

TASKS = "Majority_0_1,Majority_0_2,Majority_0_3,Add_Mod_3,Add_Mod_6"


def counts_of(name: str):
    from wtc.tasks import mips

    x, y = mips.get(name).batch(np.random.default_rng(0), 2048)
    x = x[..., 0]
    values = np.unique(x)
    counts = np.stack([np.cumsum(x == v, axis=1) for v in values], axis=-1).reshape(-1, len(values))
    return counts, y.reshape(-1).astype(float), tuple(f"n{i}" for i in range(len(values)))


def full_program(counts, d, names):
    """Every distinct row in one LP per class order and bias, misfits at 100: (best agreement or None)."""
    from wtc.extraction import argmax

    rows, weight = np.unique(np.column_stack([counts, d]), axis=0, return_counts=True)
    classes, kept = np.unique(d), None
    for with_bias in (False, True):
        for order in (classes, classes[::-1]):
            found = argmax._reading(rows, weight, np.arange(len(rows)), order, with_bias, names, counts, d, 100.0)
            if found is not None:
                kept = max(kept or 0.0, found[0].agreement)
    return kept


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=TASKS)
    p.add_argument("--full-limit", type=float, default=300.0, help="seconds per LP of the full path")
    a = p.parse_args()
    from wtc.extraction import argmax

    rows, table = [], ["| task | distinct rows | read_argmax s | reading | full LP s | its best agreement |",
                       "|---|---|---|---|---|---|"]
    for name in a.tasks.split(","):
        counts, d, names = counts_of(name)
        distinct = len(np.unique(np.column_stack([counts, d]), axis=0))
        t = time.perf_counter()
        reading = argmax.read_argmax(counts, d, names, min_agreement=0.99)
        now_s = time.perf_counter() - t
        limit, argmax.LP_TIME_LIMIT = argmax.LP_TIME_LIMIT, a.full_limit
        try:
            t = time.perf_counter()
            kept = full_program(counts, d, names)
            full_s = time.perf_counter() - t
        finally:
            argmax.LP_TIME_LIMIT = limit
        said = "none" if reading is None else reading.describe()
        rows.append({"date": stamp(), "machine": machine(), "cpu_flags": cpu_flags(), "task": name,
                     "distinct_rows": distinct, "read_argmax_s": round(now_s, 3), "reading": said,
                     "full_lp_s": round(full_s, 3), "full_best_agreement": kept})
        table.append(f"| {name} | {distinct} | {now_s:.2f} | {said} | {full_s:.2f} | "
                     f"{'-' if kept is None else f'{kept:.4f}'} |")
        print(table[-1], flush=True)
    append_rows("argmax_speed", rows)
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
