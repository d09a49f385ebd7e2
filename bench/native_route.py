"""Hard routing of a frozen DT: torch reference vs wtc._C.route_hard, side by side.

Times model.predict (WTC_KERNELS=reference vs native) on a frozen 1-layer model for several batch
sizes and thread counts; appends rows to bench/results/native_route.csv and prints a table.

    python bench/native_route.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from wtc import _native
from wtc.dt import DTConfig, DiscreteTransformer

from common import append_rows, machine, stamp  # bench/common.py (run as a script)

OUT = "native_route"


def frozen_model(seq_len: int) -> DiscreteTransformer:
    torch.manual_seed(0)
    model = DiscreteTransformer(DTConfig(replicas=1, content_fraction=1.0), seq_len=seq_len)
    with torch.no_grad():
        for p in (model.blocks[0].attn.W, model.blocks[0].attn.u):
            p.normal_()
    model.freeze()
    return model.eval()


def best_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if _native.cpu_module() is None:
        raise SystemExit("wtc._C is not built")
    when = stamp()
    rows = []
    for seq_len in (10, 64):
        model = frozen_model(seq_len)
        for n in (1000, 10000):
            x = np.random.default_rng(0).uniform(0, 100, (n, seq_len))
            for threads in (1, 2):
                torch.set_num_threads(threads)
                _native.cpu_module().set_num_threads(threads)
                timing = {}
                for mode in ("reference", "native"):
                    os.environ["WTC_KERNELS"] = mode
                    timing[mode] = best_time(lambda: model.predict(x), args.repeats)
                os.environ.pop("WTC_KERNELS")
                row = {"date": when, "machine": machine(),
                       "seq_len": seq_len, "sequences": n, "threads": threads,
                       "reference_ms": round(1e3 * timing["reference"], 2), "native_ms": round(1e3 * timing["native"], 2),
                       "speedup": round(timing["reference"] / timing["native"], 2)}
                rows.append(row)
                print(f"T={seq_len:3d} n={n:6d} threads={threads}: reference {row['reference_ms']:8.2f} ms, "
                      f"native {row['native_ms']:8.2f} ms, speedup {row['speedup']:.2f}x", flush=True)
    out = append_rows(OUT, rows)


if __name__ == "__main__":
    main()
