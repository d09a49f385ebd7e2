"""Where GPU time goes: torch.profiler tables for the routing op (B=4096, T=64) and one DT step.

For the next kernel work (bench/RESULTS.md: routing 2.4x eager where 5x is the target; a hard-phase
step ~18 ms for a tiny model): per kernel, the device time of one routing forward + backward with
the Triton kernels and with the torch reference; and for one hard-phase training step, eager and
from a CUDA graph, the device time against the wall time (what is launch overhead).

    python bench/gpu_profile.py [--out DIR]      (a CUDA device is required)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]     # bench/train_step.py's `common`, bench/kernels.py's `bench.common`
from kernels import routing_case  # noqa: E402  (bench/kernels.py)
from train_step import env, kernels_env  # noqa: E402

import wtc  # noqa: E402
from wtc.dt import DTConfig  # noqa: E402
from wtc.dt.attempt import Attempt  # noqa: E402


def table(prof, rows: int = 18) -> str:
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60)


def routing(out: Path) -> None:
    leaves, op, impls = routing_case(4096, 64, 8, "cuda")
    for impl in ("triton", "reference"):
        def step():
            loss = op(impls[impl])
            for t in leaves:
                t.grad = None
            loss.backward()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        text = f"routing B=4096 T=64 V=8, {impl}, 5 forward+backward\n" + table(prof)
        print(text, flush=True)
        (out / f"profile_routing_{impl}.txt").write_text(text)


def dt_step(out: Path) -> None:
    task = wtc.tasks.get("parity_last2")
    cfg = DTConfig(batch_size=4096, replicas=8, threads=None)
    for graphs in ("0", "1"):
        with kernels_env("reference"):
            run = Attempt(task, cfg, seed=0, attempt=0, device="cuda")
        with kernels_env("triton"), env("WTC_CUDA_GRAPHS", graphs):
            run.phase, run.step = "hard", cfg.steps + 1          # +1: off the logging steps
            for _ in range(6):
                run.train_step()
            torch.cuda.synchronize()
            run.step = cfg.steps + 1
            t = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(9):                                 # 9 steps: no logging step among them
                    run.train_step()
                torch.cuda.synchronize()
            wall = (time.perf_counter() - t) / 9
        device_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3 / 9
        text = (f"DT hard-phase step, Triton kernels, CUDA graphs {'on' if graphs == '1' else 'off'}: wall "
                f"{wall * 1e3:.2f} ms/step under the profiler, device {device_ms:.2f} ms/step\n" + table(prof))
        print(text, flush=True)
        (out / f"profile_dt_step_graphs{graphs}.txt").write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results/gpu"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_profile.py needs a CUDA device")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    routing(out)
    dt_step(out)


if __name__ == "__main__":
    main()
