"""DT hot-path ops, forward + backward: eager reference vs torch.compile vs Triton.

    python -m bench.kernels                 # on a CUDA machine: the full grid, do_bench medians
    python -m bench.kernels --smoke         # tiny shapes on any machine (CPU: Triton interpreter),
                                            # checks that every path runs; timings meaningless there

Ops (one training-time call each, annealing phase: soft selections over the stream):
  routing  the pointer heads of one layer: read q/k/v from the stream (V variables), PLE scores,
           Gumbel noise, soft attention at tau, head-overlap penalty, routing; H=3 heads, pad T-1
  mlp      the sub-MLP bank of one layer: M=32 sub-MLPs, k=2 inputs, 24 hidden units (relu+silu)
Grid: B in {256, 4096}, T in {10, 64, 256}, V in {8, 32}. Peak memory is the CUDA allocator's peak
above the inputs during one forward + backward. Writes bench/results/kernels.csv (appending) and
prints a markdown table with the ratios.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from bench.common import append_rows, machine, stamp
from wtc import kernels
from wtc.dt.attention import Attention, route_reference
from wtc.dt.selection import Choice
from wtc.dt.submlp import activate

HEADS, BINS = 3, 16
MLPS, K, HIDDEN = 32, 2, 24


def routing_case(B: int, T: int, V: int, device: str):
    """Inputs and the op for one layer of pointer heads; returns (inputs, fn(impl) -> loss)."""
    P = T - 1
    L = P + T
    g = torch.Generator(device="cpu").manual_seed(0)
    unit = torch.rand(1, B, L, V, generator=g).to(device)
    stream = torch.randn(1, B, L, V, generator=g).to(device)
    logits = torch.randn(1, 3 * HEADS, V, generator=g).to(device).requires_grad_()
    params = [torch.randn(1, HEADS, BINS, BINS, generator=g), torch.randn(1, HEADS, BINS, generator=g),
              torch.randn(1, HEADS, L, generator=g), torch.randn(1, HEADS, L, generator=g),
              torch.zeros(1, HEADS)]
    params = [p.to(device).requires_grad_() for p in params]
    content = torch.ones(1, device=device)

    def op(route):
        W, u, rel, abs_, log_scale = params
        sel = torch.softmax(logits, -1)
        choice = Choice(weights=sel)
        zq = choice.read(unit[:, :, P:], slice(0, HEADS)).transpose(2, 3)
        zk = choice.read(unit, slice(HEADS, 2 * HEADS)).transpose(2, 3)
        val = choice.read(stream, slice(2 * HEADS, 3 * HEADS)).transpose(2, 3)
        out, overlap = route(zq, zk, val, W, u, rel, abs_, log_scale.exp(), content, pad=P, tau=0.7, hard=False,
                             straight_through=False, seed=1234, overlap=True)
        penalty = Attention.penalty(overlap.sum(dim=(1, 4)) / (B * T), sel[:, 2 * HEADS:])
        return out.square().mean() + penalty.sum()

    return [logits] + params, op, {"reference": route_reference, "triton": kernels.route}


def mlp_case(B: int, T: int, V: int, device: str):
    g = torch.Generator(device="cpu").manual_seed(0)
    stream = torch.randn(1, B * T, V, generator=g).to(device).requires_grad_()
    logits = torch.randn(1, MLPS * K, V, generator=g).to(device).requires_grad_()
    W1, b1 = torch.randn(1, MLPS, HIDDEN, K, generator=g), torch.randn(1, MLPS, HIDDEN, generator=g)
    W2, b2, skip = torch.randn(1, MLPS, HIDDEN, generator=g), torch.randn(1, MLPS, generator=g), torch.randn(1, MLPS, K, generator=g)
    params = [p.to(device).requires_grad_() for p in (W1, b1, W2, b2, skip)]

    def reference(stream, sel, W1, b1, W2, b2, skip, activation):
        x = Choice(weights=sel).read(stream).unflatten(-1, (MLPS, K))                       # (1, n, M, k)
        h = activate(torch.einsum("rnmk,rmhk->rnmh", x, W1) + b1[:, None], activation)
        return torch.einsum("rnmh,rmh->rnm", h, W2) + b2[:, None] + (x * skip[:, None]).sum(-1)

    def op(bank):
        y = bank(stream, torch.softmax(logits, -1), *params, "relu+silu")
        return y.square().mean()

    return [stream, logits] + params, op, {"reference": reference, "triton": kernels.mlp_bank}


CASES = {"routing": routing_case, "mlp": mlp_case}


def timed(fn, device: str, smoke: bool) -> float:
    """Median milliseconds of fn()."""
    if device == "cuda" and not smoke:
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
    times = []
    for _ in range(1 if smoke else 5):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(case: str, B: int, T: int, V: int, impl: str, device: str, smoke: bool) -> dict:
    leaves, op, impls = CASES[case](B, T, V, device)
    if impl == "compile":
        fn_op = torch.compile(lambda: op(impls["reference"]), dynamic=False)
    else:
        fn_op = lambda: op(impls[impl])  # noqa: E731

    def step():
        loss = fn_op()
        for t in leaves:
            t.grad = None
        loss.backward()

    row = {"op": case, "B": B, "T": T, "V": V, "impl": impl}
    try:
        step()                                                   # warm-up, compilation
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            row["peak_mb"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
        row["ms"] = round(timed(step, device, smoke), 4)
        row["note"] = ""
    except Exception as exc:          # out of memory, a compile failure: record it, keep going
        row.update(ms=float("nan"), peak_mb=float("nan"), note=f"{type(exc).__name__}: {exc}"[:160])
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, any device")
    ap.add_argument("--ops", default="routing,mlp")
    ap.add_argument("--impls", default="reference,compile,triton")
    ap.add_argument("--compile-at", default="", help="BxT[,BxT...]: measure torch.compile only at these "
                    "shapes (each shape compiles anew: tens of seconds)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        raise SystemExit("bench.kernels times GPU kernels: no CUDA device here (use --smoke to check the script)")
    if device == "cpu" and not kernels.interpreting():
        raise SystemExit("--smoke on CPU runs Triton through its interpreter: set TRITON_INTERPRET=1")
    grid = [(2, 3, 4)] if args.smoke else list(itertools.product((256, 4096), (10, 64, 256), (8, 32)))
    impls = args.impls.split(",")
    rows, when = [], stamp()
    for case in args.ops.split(","):
        for B, T, V in grid:
            base = None
            for impl in impls:
                if impl == "compile" and args.compile_at and f"{B}x{T}" not in args.compile_at.split(","):
                    continue
                row = measure(case, B, T, V, impl, device, args.smoke)
                base = row["ms"] if impl == "reference" else base
                row["speedup"] = round(base / row["ms"], 2) if base and row["ms"] == row["ms"] else float("nan")
                rows.append({"date": when, "machine": machine(), "device": torch.cuda.get_device_name()
                             if device == "cuda" else "cpu", **row})
                print(f"{case:8s} B={B:5d} T={T:4d} V={V:3d} {impl:9s} {row['ms']:10.3f} ms  "
                      f"peak {row.get('peak_mb', '-')} MB  x{row['speedup']} {row['note']}", flush=True)
    if not args.smoke:
        print(f"wrote {append_rows('kernels', rows)}")
        print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    """One line per (op, B, T, V): ms and peak MB of each implementation, speedups over eager."""
    out = ["| op | B | T | V | eager ms | compile ms | triton ms | triton / eager | triton / compile | "
           "peak MB eager / compile / triton |", "|" + "---|" * 10]
    key = lambda r: (r["op"], r["B"], r["T"], r["V"])  # noqa: E731
    for k, group in itertools.groupby(sorted(rows, key=key), key=key):
        by = {r["impl"]: r for r in group}
        ms = {i: by.get(i, {}).get("ms", float("nan")) for i in ("reference", "compile", "triton")}
        mb = [str(by.get(i, {}).get("peak_mb", "-")) for i in ("reference", "compile", "triton")]
        out.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {ms['reference']:.3f} | {ms['compile']:.3f} | "
                   f"{ms['triton']:.3f} | {ms['reference'] / ms['triton']:.2f}x | {ms['compile'] / ms['triton']:.2f}x | "
                   f"{' / '.join(mb)} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
