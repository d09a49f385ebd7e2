"""The linear screen's loops (wtc.sr.screen, op sr.screen): wtc._C.screen against the numba reference
(wtc.sr.numba_eval), side by side in one run.

    python bench/sr_screen.py [--rounds 5] [--terms 400] [--out bench/results/sr_screen.json]

Two numbers per backend, alternating backend by round:
  first   a fresh interpreter's first screen() (what each discover worker pays once: numba's import
          and cache load for the reference, nothing extra for the native module), in a subprocess;
  steady  one screen() of `--terms` library terms on 128 points, in-process, after a warm-up.
The two backends' results are compared (the same Combos) before anything is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_flags, machine, stamp  # noqa: E402

PROBLEM = """
import numpy as np
from wtc.sr.screen import prepare_columns, screen
rng = np.random.default_rng(0)
vals = rng.standard_normal(({terms}, 128))
y = vals[[3, 17, 40]].T @ np.array([1.5, -2.0, 0.5]) + 0.01 * rng.standard_normal(128)
U, yc, _ = prepare_columns(vals, y, np.ones(128))
sizes = rng.integers(1, 6, len(U))
run = lambda: screen(U, yc, sizes, 0.05 * float(yc @ yc), max_lb=14)
"""


def first_call(backend: str, terms: int) -> float:
    """Seconds of the first screen() in a fresh interpreter (imports of wtc.sr done before the clock)."""
    code = PROBLEM.format(terms=terms) + "import time\nt = time.perf_counter(); run(); print(time.perf_counter() - t)\n"
    env = {**os.environ, "WTC_KERNELS": backend} if backend == "reference" else \
        {k: v for k, v in os.environ.items() if k != "WTC_KERNELS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def steady(backend: str, terms: int, repeats: int = 5) -> float:
    scope: dict = {}
    exec(PROBLEM.format(terms=terms), scope)
    old = os.environ.pop("WTC_KERNELS", None)
    if backend == "reference":
        os.environ["WTC_KERNELS"] = "reference"
    try:
        scope["run"]()                               # warm-up (numba: compiled or loaded)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            scope["run"]()
            times.append(time.perf_counter() - t)
        return min(times)
    finally:
        os.environ.pop("WTC_KERNELS", None)
        if old is not None:
            os.environ["WTC_KERNELS"] = old


def same_result(terms: int) -> bool:
    scope: dict = {}
    exec(PROBLEM.format(terms=terms), scope)
    native = scope["run"]()
    os.environ["WTC_KERNELS"] = "reference"
    try:
        return scope["run"]() == native
    finally:
        os.environ.pop("WTC_KERNELS")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--terms", type=int, default=400)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "sr_screen.json"))
    args = ap.parse_args()
    if not same_result(args.terms):
        raise SystemExit("the native screen and the numba reference disagree: nothing timed")
    rows = {b: {"first": [], "steady": []} for b in ("native", "reference")}
    for r in range(args.rounds):
        for b in (("native", "reference") if r % 2 == 0 else ("reference", "native")):
            rows[b]["first"].append(first_call(b, args.terms))
            rows[b]["steady"].append(steady(b, args.terms))
    summary = {b: {k: round(statistics.median(v), 5) for k, v in d.items()} for b, d in rows.items()}
    result = {"when": stamp(), "machine": machine(), "cpu": cpu_flags(), "terms": args.terms,
              "rounds": args.rounds, "median_s": summary, "all_s": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"cpu": result["cpu"], "median_s": summary}, indent=1))


if __name__ == "__main__":
    main()
