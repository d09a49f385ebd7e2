"""The MIPS benchmark (wtc.tasks.mips) through `wtc discover`, measured like the paper: per task
solved or not, seconds, program length, the class of each failure, and the README table.

    python bench/mips_suite.py [--tasks Bitwise_Not,Parity_Last2 (run in this order)] [--shard 1/4] [--budget 600] [--seed 0]
    python bench/mips_suite.py --table [DIR ...] [--latest] [--out DIR]   # tables what is recorded; runs nothing

Runs through wtc.suite.run, the runner of `wtc discover --suite mips` (the same attempt loop and
fresh-data verification): one directory per task under bench/results/mips/seed<S>-budget<B>/, a
rerun skips finished tasks, shards split the suite (`--shard i/n`; merge with --table DIR ...).
Beside discover's own verification, every solved program is checked once more as a user gets it:
its program.py exec'd from source (a fresh namespace, its DOMAIN check on) on fresh draws at T and,
for tasks defined at every length, at 2T (source_checks.json). machine.json records the machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "mips"
SOURCE_CHECK_SEQUENCES = 1000


def source_check(task, program_py: Path, seed: int) -> dict:
    """program.py exec'd from its source, on fresh draws at T (and 2T where the task has every
    length): the share of sequences it gets right at every position, and whether that is all."""
    namespace: dict = {}
    exec(compile(program_py.read_text(), str(program_py), "exec"), namespace)   # noqa: S102 - wtc's own output
    program = namespace["program"]
    out = {}
    for factor in (1, 2) if task.any_length else (1,):
        t = task if factor == 1 else task.at_length(factor * task.seq_len)
        x, y = t.batch(np.random.default_rng([seed, 77, factor]), SOURCE_CHECK_SEQUENCES)
        rows = [program(s[:, 0].tolist() if t.n_inputs == 1 else [tuple(r) for r in s.tolist()]) for s in x]
        pred = t._as_3d(np.asarray(rows, dtype=np.float64), "prediction")
        ok = (np.round(pred) == y)[:, t.valid_from:].reshape(len(x), -1).all(axis=1)
        out[f"T={t.seq_len}"] = {"sequences": len(x), "right": float(ok.mean()), "holds": bool(ok.all())}
    return out


def main() -> int:
    from wtc import suite
    from wtc.tasks import mips

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=None, help="comma-separated paper names (default: all 62)")
    p.add_argument("--shard", default=None, metavar="I/N", help="every N-th task from the I-th (1-based)")
    p.add_argument("--budget", type=float, default=600.0, help="seconds per task (discover's budget)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="result directory (default bench/results/mips/seed<S>-budget<B>)")
    p.add_argument("--table", nargs="*", default=None, metavar="DIR", help="merge these result directories into "
                   "one table (default: the --out directory); run nothing")
    p.add_argument("--latest", action="store_true", help="with --table: runs made one after another (other "
                   "engines); a task in several keeps the last directory's row")
    a = p.parse_args()
    full = suite.mips()
    out = Path(a.out) if a.out else RESULTS / f"seed{a.seed}-budget{a.budget:g}"
    if a.table is not None:
        dirs = a.table or [out]
        where = Path(a.out) if a.out else Path(dirs[0])        # --out: a merged table's own directory
        suite.write_table(full, dirs, where, latest=a.latest)
        print((where / "results.md").read_text(), end="")
        return 0
    names = None
    if a.tasks:
        names = a.tasks.split(",")
        for n in names:
            mips.entry(n)                     # an unknown name is an error, with the close ones
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.json").write_text(json.dumps({"machine": machine(), "date": stamp()}, indent=2))
    t0 = time.perf_counter()
    rows = suite.run(full, out, seed=a.seed, budget_s=a.budget, shard=suite.parse_shard(a.shard), only=names,
                     progress=False)
    checks_path = out / "source_checks.json"
    checks = json.loads(checks_path.read_text()) if checks_path.exists() else {}
    for row in rows:
        if row["solved"] and row["name"] not in checks and (out / row["name"] / "program.py").exists():
            checks[row["name"]] = source_check(mips.get(row["name"]), out / row["name"] / "program.py", a.seed)
    checks_path.write_text(json.dumps(checks, indent=2))
    suite.write_table(full, [out], out)
    print((out / "results.md").read_text(), end="")
    for name, c in checks.items():
        print(f"{name}: program.py exec'd from source: " + ", ".join(
            f"{k} {v['right']:.4f} of {v['sequences']}" for k, v in c.items()))
    print(f"wall {time.perf_counter() - t0:.0f}s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
