"""ACE Gramians and core extraction: native streaming vs the torch float64 reference.

For each D, N rows of activations h (D) and Jacobians J (K, D), float32, arrive in chunks of
`chunk` rows (a small pool of pre-drawn chunks, cycled, stands in for a model's forward/backward
passes) and are folded into the float64 Gramians:
- native:    wtc.ace.GramianAccumulator(backend="native")  (wtc._C: blocked syrk, Chan merge)
- reference: GramianAccumulator(backend="reference")       (torch float64: h.double(), centre, matmul)
- matmul:    only the two products torch float64 H.T @ H and J.T @ J per chunk (chunks already in
             float64): the floor the issue measures against ("native within 2x of it").
Then the core: exact balanced SVD (two eigh + a D x D SVD) vs randomized (rank r, oversample 10,
2 power iterations; Cholesky factors), with the subspace overlap of the two top-r cores. The data
have a core: activations with a power-law spectrum, Jacobians reading r planted directions plus 1%
noise (a gap after r in the balanced spectrum, as a trained layer's core has).

Memory: peak RSS growth during each streaming run (VmHWM reset through /proc/self/clear_refs before
it; without that, the growth of ru_maxrss) next to N x D x 8 bytes, what holding H in float64 would
take. tracemalloc is not used: torch and the C++ kernel allocate outside Python's allocator.

Median wall time over --repeat runs, methods interleaved (this machine is shared and noisy).
Appends to bench/results/ace.csv and prints a markdown table.

    python -m bench.ace --quick          # D 128, 1024, 4096 at N 2^17, 2^14, 2^12 (< 2 min, 2 cores)
    python -m bench.ace                  # N = 10^6, 10^6, 10^5 (tens of minutes)
    python -m bench.ace --dims 1024 --n 1000000 --chunk 8192
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from bench.common import append_rows, machine, stamp
from wtc import _native
from wtc.ace import GramianAccumulator, balanced_svd, projector_overlap

QUICK_N = {128: 1 << 17, 1024: 1 << 14, 4096: 1 << 12}
FULL_N = {128: 1_000_000, 1024: 1_000_000, 4096: 100_000}


def default_chunk(D: int) -> int:
    return max(256, min(8192, (1 << 23) // D))


# ---- memory -------------------------------------------------------------------------------------

def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_growth_mb(fn):
    """(result of fn(), MB the process's peak RSS rose above its RSS at the start, how measured)."""
    rss0 = _status_kb("VmRSS")
    if rss0 is not None and _reset_hwm():
        out = fn()
        return out, max(0, _status_kb("VmHWM") - rss0) / 1024, "VmHWM"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = fn()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out, (after - before) / 1024, "maxrss"


# ---- the three streaming runs --------------------------------------------------------------------

def stream(D, N, chunk, pool, backend):
    acc = GramianAccumulator(D, backend=backend)
    done = i = 0
    while done < N:
        h, J = pool[i % len(pool)]
        take = min(chunk, N - done)
        acc.add(h[:take], J[:take])
        done += take
        i += 1
    return acc


def matmuls(D, N, chunk, pool64):
    done = i = 0
    while done < N:
        h, J = pool64[i % len(pool64)]
        take = min(chunk, N - done)
        h.narrow(0, 0, take).T @ h.narrow(0, 0, take)
        Jf = J.narrow(0, 0, take).reshape(-1, D)
        Jf.T @ Jf
        done += take
        i += 1


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def bench_dim(D, N, chunk, K, repeat, rank, exact_svd, have_native, svd_repeat):
    # activations: correlated, power-law spectrum, nonzero mean; Jacobians: a readout of `rank`
    # planted directions plus 1% noise, so the balanced spectrum has a gap after `rank`
    g = torch.Generator().manual_seed(D)
    Q1 = torch.linalg.qr(torch.randn(D, D, generator=g)).Q
    mix = (torch.arange(1, D + 1, dtype=torch.float32) ** -0.5)[:, None] * Q1.T
    P = torch.linalg.qr(torch.randn(D, rank, generator=g)).Q.T * torch.linspace(1.0, 0.5, rank)[:, None]
    pool = []
    for _ in range(2):
        h = (torch.randn(chunk, D, generator=g) @ mix + 0.5).contiguous()
        J = (torch.randn(chunk, K, rank, generator=g) @ P + 0.01 * torch.randn(chunk, K, D, generator=g)).contiguous()
        pool.append((h, J))
    pool64 = [(h.double(), J.double()) for h, J in pool]
    row = {"D": D, "N": N, "chunk": chunk, "K": K}
    times = {"native": [], "reference": [], "matmul": []}
    peaks, how = {}, ""
    acc = None
    for rep in range(repeat):
        for method in (["native"] if have_native else []) + ["reference", "matmul"]:
            fn = (lambda: matmuls(D, N, chunk, pool64)) if method == "matmul" else \
                (lambda m=method: stream(D, N, chunk, pool, m))
            if rep == 0:
                (t, out), peak, how = peak_growth_mb(lambda fn=fn: timed(fn))
                peaks[method] = peak
            else:
                t, out = timed(fn)
            times[method].append(t)
            if method == "native" or (method == "reference" and acc is None):
                acc = out
    for method, ts in times.items():
        row[f"{method}_s"] = round(statistics.median(ts), 4) if ts else None
    mm = row["matmul_s"]
    row["native_over_matmul"] = round(row["native_s"] / mm, 3) if have_native else None
    row["reference_over_matmul"] = round(row["reference_s"] / mm, 3)
    row["native_peak_mb"] = round(peaks["native"], 1) if have_native else None
    row["reference_peak_mb"] = round(peaks["reference"], 1)
    row["matmul_peak_mb"] = round(peaks["matmul"], 1)
    row["state_mb"] = round(2 * D * D * 8 / 2 ** 20, 1)
    row["NxD_f64_mb"] = round(N * D * 8 / 2 ** 20, 1)
    row["memory_by"] = how

    cov, obs = acc.covariance(), acc.observability()
    t_r = []
    for _ in range(svd_repeat):
        t, (b_r, s_r) = timed(lambda: balanced_svd(cov, obs, rank=rank, method="randomized"))
        t_r.append(t)
    row["rank"] = rank
    row["randomized_svd_s"] = round(statistics.median(t_r), 4)
    if exact_svd:
        t_x = []
        for _ in range(svd_repeat):
            t, (b_x, s_x) = timed(lambda: balanced_svd(cov, obs))
            t_x.append(t)
        row["exact_svd_s"] = round(statistics.median(t_x), 4)
        row["overlap_top_r"] = round(projector_overlap(b_r, b_x[:, :rank]), 10)
        row["s_rel_err"] = float(((s_r - s_x[:rank]).abs() / s_x[:rank]).max())
    else:
        row["exact_svd_s"] = row["overlap_top_r"] = row["s_rel_err"] = None
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="N = 2^17, 2^14, 2^12 for D = 128, 1024, 4096; "
                    "one repeat at D = 4096, SVDs timed once, no exact SVD at D = 4096")
    ap.add_argument("--dims", default="128,1024,4096")
    ap.add_argument("--n", type=int, default=None, help="rows streamed per D (default: by D, see FULL_N/QUICK_N)")
    ap.add_argument("--chunk", type=int, default=None, help="rows per chunk (default: 2^23 / D, in [256, 8192])")
    ap.add_argument("--K", type=int, default=1, help="readout outputs per sample (J is (n, K, D))")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rank", type=int, default=8, help="planted core rank = rank of the randomized balanced SVD")
    ap.add_argument("--exact-max-d", type=int, default=None,
                    help="largest D that also gets the exact balanced SVD (default: 1024 with --quick, else all)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    C = _native.cpu_module()
    have_native = C is not None
    if have_native:
        C.set_num_threads(args.threads)
    kernel = C.gramian_kernel() if have_native else "not built"
    exact_max = args.exact_max_d if args.exact_max_d is not None else (1024 if args.quick else 1 << 30)
    print(f"native kernel: {kernel}, threads {args.threads}", flush=True)

    rows = []
    t_start = time.perf_counter()
    for D in [int(d) for d in args.dims.split(",")]:
        N = args.n or (QUICK_N if args.quick else FULL_N).get(D, 1 << 14 if args.quick else 100_000)
        chunk = args.chunk or default_chunk(D)
        repeat = 1 if (args.quick and D >= 4096) else args.repeat
        row = bench_dim(D, N, chunk, args.K, repeat, args.rank, D <= exact_max, have_native,
                        1 if args.quick else repeat)
        row.update({"repeat": repeat, "kernel": kernel, "threads": args.threads,
                    "date": stamp(), "machine": machine()})
        rows.append(row)
        print(row, flush=True)
    path = append_rows("ace", rows)

    def f(v, fmt="{:.3f}"):
        return "—" if v is None else fmt.format(v)

    print(f"\nGramian streaming, float32 chunks -> float64 (median of repeats, {args.threads} threads, "
          f"kernel {kernel}); {rows[0]['date']}, {rows[0]['machine']}; total {time.perf_counter() - t_start:.0f} s\n")
    print("| D | N | chunk | native s | reference s | matmul s | native / matmul | reference / matmul "
          "| peak MB native / ref / matmul | state MB | N×D f64 MB | exact SVD s | randomized SVD s (r) | overlap |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['D']} | {r['N']} | {r['chunk']} | {f(r['native_s'])} | {f(r['reference_s'])} | {f(r['matmul_s'])} "
              f"| {f(r['native_over_matmul'], '{:.2f}x')} | {f(r['reference_over_matmul'], '{:.2f}x')} "
              f"| {f(r['native_peak_mb'], '{:.0f}')} / {f(r['reference_peak_mb'], '{:.0f}')} / "
              f"{f(r['matmul_peak_mb'], '{:.0f}')} | {r['state_mb']:.0f} | {r['NxD_f64_mb']:.0f} | {f(r['exact_svd_s'])} "
              f"| {f(r['randomized_svd_s'])} ({r['rank']}) | {f(r['overlap_top_r'], '{:.10f}')} |")
    print(f"\n(appended to {path})")


if __name__ == "__main__":
    main()
