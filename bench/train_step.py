"""DT training throughput on CPU: steps/s at B=256, T=10, eager vs torch.compile, by threads and
population size (hard-phase steps, see time_steps). Prints a table and appends rows to
bench/results/train_step.csv.

    python bench/train_step.py [--steps 30] [--task parity_last2] [--no-compile]
"""
from __future__ import annotations

import argparse
import time

import torch

import wtc
from wtc.dt import DTConfig
from wtc.dt.train import Attempt, torch_threads

from common import append_rows, machine, stamp  # bench/common.py (run as a script)

OUT = "train_step"


def time_steps(task, config: DTConfig, mode: str, steps: int) -> tuple[float, float]:
    """(steps/s, compile-or-warmup seconds) of Attempt.train_step under `mode`."""
    run = Attempt(task, config, seed=0, attempt=0)
    # time hard-phase steps: tau is fixed there. During annealing tau changes every step, and a
    # Python float in the graph makes torch.compile recompile each step (it falls back to eager).
    run.phase, run.step = "hard", config.steps
    if mode == "compile":
        run.model.forward = torch.compile(run.model.forward, dynamic=False)
    t0 = time.perf_counter()
    for _ in range(3):          # warm-up (and compilation)
        run.train_step()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        run.train_step()
    return steps / (time.perf_counter() - t0), warm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--task", default="parity_last2")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    task = wtc.tasks.get(args.task)
    modes = ["eager"] + ([] if args.no_compile else ["compile"])
    rows = []
    when = stamp()
    for replicas in (1, 8):
        for threads in (1, 2):
            for mode in modes:
                cfg = DTConfig(batch_size=args.batch, replicas=replicas, threads=threads)
                with torch_threads(threads):
                    try:
                        sps, warm = time_steps(task, cfg, mode, args.steps)
                        note = ""
                    except Exception as exc:  # torch.compile can fail on some setups: report it
                        sps, warm, note = float("nan"), float("nan"), f"{type(exc).__name__}: {exc}"[:120]
                rows.append({"date": when, "machine": machine(),
                             "task": task.name, "batch": args.batch, "replicas": replicas, "threads": threads,
                             "mode": mode, "steps_per_s": round(sps, 2),
                             "replica_steps_per_s": round(sps * replicas, 2), "warmup_s": round(warm, 1),
                             "note": note})
                r = rows[-1]
                print(f"R={replicas} threads={threads} {mode:8s} {r['steps_per_s']:8.2f} steps/s  "
                      f"{r['replica_steps_per_s']:8.2f} replica-steps/s  warm-up {r['warmup_s']}s {note}", flush=True)
    out = append_rows(OUT, rows)
    print(f"appended {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
