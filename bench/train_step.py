"""DT training throughput: steps/s, eager vs torch.compile (and the Triton kernels on a GPU).

CPU (default): B=256, T=10, by threads and population size. GPU (--device cuda): the reference
path eager, compiled, and with the Triton kernels (WTC_KERNELS=triton), at --batch (default 4096
there), in the annealing phase (soft selections, Gumbel noise, redundancy penalty: the kernels'
main work) and the hard phase, where "+graphs" rows replay the step from a CUDA graph
(wtc.dt.graph_step; the other rows run with WTC_CUDA_GRAPHS=0). Prints a table and appends rows to bench/results/train_step.csv.

    python bench/train_step.py [--steps 30] [--task parity_last2] [--no-compile] [--device cuda]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
import warnings

import torch

import wtc
from wtc.dt import DTConfig
from wtc.dt.attempt import Attempt
from wtc.threads import torch_threads

from common import append_rows, machine, stamp  # bench/common.py (run as a script)

OUT = "train_step"


def time_steps(task, config: DTConfig, mode: str, steps: int, device: str = "cpu",
               phase: str = "hard") -> tuple[float, float]:
    """(steps/s, compile-or-warmup seconds) of Attempt.train_step under `mode` (eager, compile,
    triton) in `phase` (hard: tau fixed; anneal: tau changes every step)."""
    # the Attempt is built under the reference path: it measures the untrained model's ranges on
    # the CPU before moving to the device, where WTC_KERNELS=triton would refuse CPU tensors
    with kernels_env("reference"):
        run = Attempt(task, config, seed=0, attempt=0, device=device)
    kernels = "triton" if mode.startswith("triton") else "reference"
    graphs = "1" if mode.endswith("+graphs") else "0"
    with kernels_env(kernels), env("WTC_CUDA_GRAPHS", graphs):
        # hard-phase steps by default: tau is fixed there. During annealing tau changes every step, and
        # a Python float in the graph makes torch.compile recompile each step (it falls back to eager).
        if phase == "hard":
            run.phase, run.step = "hard", config.steps
        if mode == "compile":
            run.model.forward = torch.compile(run.model.forward, dynamic=False)
        t0 = time.perf_counter()
        for _ in range(5):          # warm-up (compilation; a CUDA graph's side-stream steps and capture)
            run.train_step()
        sync(device)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(steps):
            run.train_step()
        sync(device)
        return steps / (time.perf_counter() - t0), warm


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


def kernels_env(value: str):
    return env("WTC_KERNELS", value)


def main_gpu(args, task) -> None:
    rows, when = [], stamp()
    for phase in ("anneal", "hard"):
        base = None
        graphed = ["eager+graphs", "triton+graphs"] if phase == "hard" else []   # wtc.dt.graph_step
        for mode in ["eager"] + ([] if args.no_compile else ["compile"]) + ["triton"] + graphed:
            cfg = DTConfig(batch_size=args.batch or 4096, replicas=8, threads=None)
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    sps, warm = time_steps(task, cfg, mode, args.steps, "cuda", phase)
                note = "; ".join(str(w.message) for w in caught)[:300]
            except Exception as exc:
                sps, warm, note = float("nan"), float("nan"), f"{type(exc).__name__}: {exc}"[:120]
            base = sps if mode == "eager" else base
            rows.append({"date": when, "machine": machine(), "device": torch.cuda.get_device_name(),
                         "task": task.name, "batch": cfg.batch_size, "replicas": cfg.replicas, "phase": phase,
                         "mode": mode, "steps_per_s": round(sps, 2), "speedup": round(sps / base, 2) if base else "",
                         "warmup_s": round(warm, 1), "note": note})
            r = rows[-1]
            print(f"{phase:6s} {mode:8s} {r['steps_per_s']:8.2f} steps/s  x{r['speedup']}  warm-up {r['warmup_s']}s "
                  f"{note}", flush=True)
    print(f"appended {len(rows)} rows to {append_rows(OUT + '_gpu', rows)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--task", default="parity_last2")
    ap.add_argument("--batch", type=int, default=None, help="default 256 on CPU, 4096 on a GPU")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    task = wtc.tasks.get(args.task)
    if args.device == "cuda":
        return main_gpu(args, task)
    args.batch = args.batch or 256
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
