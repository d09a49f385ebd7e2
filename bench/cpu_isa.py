"""The DT training step on reduced instruction-set paths, side by side: where could a 3-4x slower
`wtc discover` on an AVX2-only (AMD EPYC) machine come from?

Each variant is a worker process started with its environment (these settings are read when the
libraries load, so they cannot change inside one process), holding fresh `Attempt`s of parity_last2
at DTConfig() (rung 0, 1 torch thread, what training uses; bench/dt_step.py's make_attempt). Rounds
are interleaved (the order rotates every round): each round, every worker times `--steps` real
`Attempt.train_step()` calls of a phase after one warm-up step; reported: the median over rounds of
the per-round mean, and the median of the per-round ratio to "default" (same round, so the shared
machine's drift mostly cancels).

    default            as installed: torch's ATen kernels at the CPU's best (AVX512 here), MKL's best
                       path, the native DT kernels' widest copy (wtc._C.dt_isa)
    default_ftz        default plus torch.set_flush_denormal(True) in the worker
    aten_avx2          ATEN_CPU_CAPABILITY=avx2 (torch's own vectorised kernels in their AVX2 build)
    native_avx2        WTC_NATIVE_ISA=avx2 (csrc/dt_isa.h: the x86-64-v3 copy of the DT kernels)
    native_portable    WTC_NATIVE_ISA=portable (the baseline x86-64 copy: SSE2)
    mkl_avx2           MKL_ENABLE_INSTRUCTIONS=AVX2 (MKL's AVX2 code path)
    mkl_sse42          MKL_ENABLE_INSTRUCTIONS=SSE4_2 (what MKL may pick on a CPU it does not trust)
    onednn_avx2        ONEDNN_MAX_CPU_ISA=AVX2
    all_avx2           the four above at AVX2 together: an AVX2-only machine as far as software can tell
    all_avx2_ftz       all_avx2 plus torch.set_flush_denormal(True) in the worker (denormals in torch ops)
    all_baseline       ATEN_CPU_CAPABILITY=default, WTC_NATIVE_ISA=portable, MKL SSE4_2, oneDNN SSE41
    reference          WTC_KERNELS=reference (no native DT kernels: the torch path)

Each worker reports what it runs (torch's CPU capability, the DT kernels' ISA, MKL's banner under
MKL_VERBOSE in a probe process). Then a torch.profiler breakdown of anneal and hard steps under
default and all_avx2 (and, in the default worker, the two native ops alone on one real step's
inputs under each ISA, switched in-process and interleaved): the native DT ops' share (their calls wrapped in named ranges), torch's aten ops' self
time (top ones named; the matmul family, which MKL runs, summed), and the rest (Python, the autograd
engine, the profiler's own per-op cost; the unprofiled step is given next to it). `--whole N`: also
fresh attempts trained through N anneal + N // 3 hard steps (the mean step, the late anneal and its
near-denormal softmaxes included), `--whole-rounds` per variant of `--whole-variants`, interleaved.

    python bench/cpu_isa.py [--rounds 5] [--steps 10] [--variants default,all_avx2,...]
                            [--whole 0] [--whole-rounds 1] [--whole-variants default,all_avx2,...]

Writes bench/results/cpu_isa.json and prints markdown tables.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from common import RESULTS, machine, stamp  # bench/common.py (run as a script)

OUT = RESULTS / "cpu_isa.json"
TASK = "parity_last2"
ALL_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "WTC_NATIVE_ISA": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "ONEDNN_MAX_CPU_ISA": "AVX2"}
VARIANTS = {
    "default": {},
    "default_ftz": {"BENCH_FLUSH_DENORMAL": "1"},
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "native_avx2": {"WTC_NATIVE_ISA": "avx2"},
    "native_portable": {"WTC_NATIVE_ISA": "portable"},
    "mkl_avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "mkl_sse42": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "onednn_avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "all_avx2": ALL_AVX2,
    "all_avx2_ftz": {**ALL_AVX2, "BENCH_FLUSH_DENORMAL": "1"},
    "all_baseline": {"ATEN_CPU_CAPABILITY": "default", "WTC_NATIVE_ISA": "portable",
                     "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "reference": {"WTC_KERNELS": "reference"},
}
CLEARED = {"ATEN_CPU_CAPABILITY", "WTC_NATIVE_ISA", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
           "WTC_KERNELS", "BENCH_FLUSH_DENORMAL", "MKL_VERBOSE", "ONEDNN_VERBOSE"}
NATIVE_OPS = ("dt_route_forward", "dt_route_backward", "dt_mlp_forward", "dt_mlp_backward", "gumbel_hash",
              "route_hard")
MATMUL_OPS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::dot", "aten::mv"}


def lscpu() -> dict:
    """The CPU's model name and flags line, as lscpu prints them."""
    out = {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"error": str(exc)}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("Model name", "Flags", "Vendor ID", "CPU(s)"):
            out[key.strip()] = value.strip()
    return out


def env_for(name: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(OMP_NUM_THREADS="1", **VARIANTS[name])
    return env


def mkl_banner(name: str) -> str:
    """MKL's first MKL_VERBOSE line (its version and the instruction set it enabled) under variant name."""
    code = "import torch; a = torch.randn(64, 64); a @ a"
    done = subprocess.run([sys.executable, "-c", code], env={**env_for(name), "MKL_VERBOSE": "1"},
                          capture_output=True, text=True, timeout=300)
    line = next((x for x in done.stdout.splitlines() if x.startswith("MKL_VERBOSE oneMKL")), "")
    return line.replace("MKL_VERBOSE ", "").split(", Lnx")[0]


def mkl_isa(banner: str) -> str:
    """The instruction set named in MKL's banner ("Intel(R) AVX-512", "Intel(R) AVX2", ...)."""
    found = re.search(r"\((Intel\(R\) [^)]+)\)", banner)
    return found.group(1) if found else (banner[-40:] or "?")


# ---------------------------------------------------------------------- the worker (one per variant)
def worker() -> None:
    """Internal (--worker): answer stdin lines 'time PHASE STEPS' | 'whole STEPS' | 'profile PHASE STEPS'
    with one JSON line each, after a 'ready' line saying what this process runs."""
    import torch

    import wtc
    from wtc import _native
    from wtc.backend import choose
    from wtc.dt import DTConfig
    from wtc.dt.attempt import Attempt
    from dt_step import make_attempt  # bench/dt_step.py

    torch.set_num_threads(1)
    if os.environ.get("BENCH_FLUSH_DENORMAL") == "1":
        torch.set_flush_denormal(True)
    task = wtc.tasks.get(TASK)
    probe = torch.zeros(1)
    print(json.dumps({"wtc": os.path.dirname(wtc.__file__), "torch": torch.__version__,
                      "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "dt_isa": _native.dt_isa_report(), "dt.route": choose("dt.route", probe),
                      "dt.mlp_bank": choose("dt.mlp_bank", probe)}), flush=True)
    runs = {}
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "whole":
            steps = int(args[0])
            run = Attempt(task, DTConfig(steps=steps, hard_steps=max(1, steps // 3)), seed=0, attempt=0)
            n, t0 = 0, time.perf_counter()
            while run.phase in ("anneal", "hard"):
                run.train_step()
                n += 1
            wall = time.perf_counter() - t0
            print(json.dumps({"mean_step_s": wall / n, "steps": n, "wall_s": wall}), flush=True)
            continue
        phase, steps = args[0], int(args[1])
        if phase not in runs:
            runs[phase] = make_attempt(task, DTConfig(), phase)
        run = runs[phase]
        if cmd == "time":
            run.train_step()
            t0 = time.perf_counter()
            for _ in range(steps):
                run.train_step()
            print(json.dumps({"mean_step_s": (time.perf_counter() - t0) / steps}), flush=True)
        elif cmd == "profile":
            print(json.dumps(profile(run, steps)), flush=True)
        elif cmd == "ops":
            print(json.dumps(native_ops(run, steps)), flush=True)


def native_ops(run, reps: int) -> dict:
    """Forward + backward of the step's two native DT ops on the inputs of one real step, under each
    ISA this CPU runs (switched in-process with wtc._C.set_dt_isa), the ISAs interleaved rep by rep:
    {op: {isa: {"min_ms", "median_ms"}}}. Min over reps: the least disturbed by a shared machine."""
    import torch

    from wtc import _native
    from wtc.kernels import cpu

    C = _native.cpu_module()
    calls, route, bank = {}, cpu.route, cpu.mlp_bank

    def keep(name, fn):
        def call(*a, **k):
            calls.setdefault(name, (a, k))
            return fn(*a, **k)
        return call

    cpu.route, cpu.mlp_bank = keep("route", route), keep("mlp_bank", bank)
    try:
        run.train_step()
    finally:
        cpu.route, cpu.mlp_bank = route, bank
    ops = {"route": route, "mlp_bank": bank}
    before, times = C.dt_isa(), {}
    try:
        for _ in range(reps):
            for isa in C.dt_isas():
                C.set_dt_isa(isa)
                for name, (a, k) in calls.items():
                    leaves = [x.detach().requires_grad_(x.requires_grad) if torch.is_tensor(x) else x for x in a]
                    t0 = time.perf_counter()
                    out = ops[name](*leaves, **k)
                    out = out[0] if isinstance(out, tuple) else out
                    grads = [x for x in leaves if torch.is_tensor(x) and x.requires_grad]
                    torch.autograd.grad(out.sum(), grads)
                    times.setdefault(name, {}).setdefault(isa, []).append(time.perf_counter() - t0)
    finally:
        C.set_dt_isa(before)
    return {name: {isa: {"min_ms": round(min(ts) * 1e3, 3), "median_ms": round(statistics.median(ts) * 1e3, 3)}
                   for isa, ts in per.items()} for name, per in times.items()}


def profile(run, steps: int) -> dict:
    """Where `steps` train steps of `run` spend their time: the native DT ops (wtc._C calls wrapped
    in named ranges), torch's aten ops by self time, and the remainder."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    from wtc import _native

    C = _native.cpu_module()
    saved = {name: getattr(C, name) for name in NATIVE_OPS}

    def wrapped(name, fn):
        def call(*a, **k):
            with record_function(f"native::{name}"):
                return fn(*a, **k)
        return call

    run.train_step()
    t0 = time.perf_counter()
    for _ in range(steps):
        run.train_step()
    plain = (time.perf_counter() - t0) / steps
    try:
        for name, fn in saved.items():
            setattr(C, name, wrapped(name, fn))
        run.train_step()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                run.train_step()
            wall = (time.perf_counter() - t0) / steps
    finally:
        for name, fn in saved.items():
            setattr(C, name, fn)
    per_step = lambda us: us / 1e3 / steps  # noqa: E731   profiler microseconds -> ms per step
    native, aten = {}, {}
    for a in prof.key_averages():
        if a.key.startswith("native::"):
            native[a.key[len("native::"):]] = (per_step(a.cpu_time_total), round(a.count / steps, 1))
        elif a.key.startswith("aten::"):
            aten[a.key] = (per_step(a.self_cpu_time_total), round(a.count / steps, 1))
    native_ms = sum(v[0] for v in native.values())
    aten_ms = sum(v[0] for v in aten.values())
    matmul_ms = sum(v[0] for k, v in aten.items() if k in MATMUL_OPS)
    top = sorted(aten.items(), key=lambda kv: kv[1][0], reverse=True)[:12]
    wall_ms = wall * 1e3
    return {
        "steps": steps, "unprofiled_step_ms": round(plain * 1e3, 2), "profiled_step_ms": round(wall_ms, 2),
        "native_ms": round(native_ms, 3), "aten_self_ms": round(aten_ms, 3), "matmul_family_ms": round(matmul_ms, 3),
        "rest_ms": round(wall_ms - native_ms - aten_ms, 3),
        "shares": {"native DT ops": round(native_ms / wall_ms, 3), "aten ops (self)": round(aten_ms / wall_ms, 3),
                   "of which matmul family (MKL)": round(matmul_ms / wall_ms, 3),
                   "Python + autograd engine + profiler": round(1 - (native_ms + aten_ms) / wall_ms, 3)},
        "aten_calls_per_step": round(sum(v[1] for v in aten.values()), 1),
        "native": {k: {"ms_per_step": round(v[0], 3), "calls_per_step": v[1]} for k, v in native.items()},
        "top_aten": [{"op": k, "self_ms_per_step": round(v[0], 3), "share": round(v[0] / wall_ms, 3),
                      "calls_per_step": v[1]} for k, v in top],
    }


# ---------------------------------------------------------------------- the driver
class Workers:
    """One worker process per variant; ask() sends one command to one of them and returns its JSON answer."""

    def __init__(self, names):
        here = os.path.dirname(os.path.abspath(__file__))
        self.procs, self.ready = {}, {}
        for name in names:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=env_for(name), cwd=here)
            self.procs[name] = proc
            self.ready[name] = json.loads(proc.stdout.readline())

    def ask(self, name: str, command: str) -> dict:
        proc = self.procs[name]
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {name} died on {command!r}")
        return json.loads(line)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.stdin.close()
            proc.wait()


def interleaved(workers: Workers, names: list[str], command: str, rounds: int) -> dict:
    """{name: [per-round mean step seconds]}, the order rotating every round."""
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(workers.ask(name, command)["mean_step_s"])
    return times


def summarise(times: dict) -> dict:
    base = times.get("default")
    out = {}
    for name, ts in times.items():
        row = {"ms": round(statistics.median(ts) * 1e3, 2), "rounds_ms": [round(t * 1e3, 2) for t in ts]}
        if base:
            row["vs_default"] = round(statistics.median(t / b for t, b in zip(ts, base)), 3)
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    ap.add_argument("--profile-steps", type=int, default=20)
    ap.add_argument("--op-reps", type=int, default=30, help="reps of each native op per ISA (in-process)")
    ap.add_argument("--whole", type=int, default=0, help="anneal steps of one whole attempt per variant (0: none)")
    ap.add_argument("--whole-rounds", type=int, default=1)
    ap.add_argument("--whole-variants", default="", help="default: every variant run")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    if args.worker:
        return worker()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    report = {"date": stamp(), "machine": machine(), "lscpu": lscpu(), "cores": os.cpu_count(),
              "load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "task": TASK, "config": "DTConfig() (rung 0)",
              "threads": 1, "rounds": args.rounds, "steps_per_round": args.steps,
              "note": "an AVX-512 Intel machine: the AVX2 / SSE paths are emulated by the settings, not measured "
                      "on an AVX2-only CPU", "variants": {n: VARIANTS[n] for n in names}}
    report["mkl"] = {n: mkl_banner(n) for n in names}
    workers = Workers(names)
    report["workers"] = workers.ready
    try:
        for phase in ("anneal", "hard"):
            report[phase] = summarise(interleaved(workers, names, f"time {phase} {args.steps}", args.rounds))
            print_phase(phase, report[phase], report["workers"], report["mkl"])
            save(report, args.out)
        if "default" in names:
            report["native_ops"] = {p: workers.ask("default", f"ops {p} {args.op_reps}") for p in ("anneal", "hard")}
            print_ops(report["native_ops"])
        report["profile"] = {}
        for name in [n for n in ("default", "all_avx2") if n in names]:
            report["profile"][name] = {p: workers.ask(name, f"profile {p} {args.profile_steps}")
                                       for p in ("anneal", "hard")}
            print_profile(name, report["profile"][name])
        if args.whole:
            whole = [n.strip() for n in args.whole_variants.split(",") if n.strip() in names] or names
            report["whole"] = summarise(interleaved(workers, whole, f"whole {args.whole}", args.whole_rounds))
            report["whole_anneal_steps"], report["whole_rounds"] = args.whole, args.whole_rounds
            print_phase(f"whole attempt ({args.whole} + {max(1, args.whole // 3)} steps)", report["whole"],
                        report["workers"], report["mkl"])
    finally:
        workers.close()
    report["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    save(report, args.out)
    print(f"\nwrote {args.out}")


def save(report: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def print_phase(phase: str, rows: dict, ready: dict, mkl: dict) -> None:
    print(f"\n{phase}: step ms (median of rounds), ratio to default (median of per-round ratios)\n")
    print("| variant | ms | vs default | torch capability | DT kernels | MKL |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        w = ready[name]
        dt = w["dt_isa"].split(" (")[0] if w["dt.route"] == "native" else "reference (torch)"
        print(f"| {name} | {row['ms']:.1f} | {row.get('vs_default', 1.0):.2f} | {w['torch_cpu_capability']} | {dt} | "
              f"{mkl_isa(mkl[name])} |", flush=True)


def print_ops(ops: dict) -> None:
    print("\nnative DT ops, forward + backward on one real step's inputs, per ISA (min / median ms)\n")
    print("| phase | op | " + " | ".join(next(iter(next(iter(ops.values())).values()))) + " |")
    print("|---|---|" + "---|" * len(next(iter(next(iter(ops.values())).values()))))
    for phase, per_op in ops.items():
        for name, per_isa in per_op.items():
            print(f"| {phase} | {name} | " + " | ".join(f"{v['min_ms']:.2f} / {v['median_ms']:.2f}"
                                                    for v in per_isa.values()) + " |")


def print_profile(name: str, prof: dict) -> None:
    for phase, p in prof.items():
        print(f"\nprofile, {name}, {phase}: unprofiled {p['unprofiled_step_ms']} ms/step, profiled "
              f"{p['profiled_step_ms']} ms/step, {p['aten_calls_per_step']} aten calls/step\n")
        print("| part | ms/step | share |")
        print("|---|---|---|")
        print(f"| native DT ops | {p['native_ms']:.2f} | {p['shares']['native DT ops']:.1%} |")
        print(f"| aten ops (self) | {p['aten_self_ms']:.2f} | {p['shares']['aten ops (self)']:.1%} |")
        print(f"| - matmul family (MKL) | {p['matmul_family_ms']:.2f} | {p['shares']['of which matmul family (MKL)']:.1%} |")
        print(f"| rest: Python, autograd, profiler | {p['rest_ms']:.2f} | "
              f"{p['shares']['Python + autograd engine + profiler']:.1%} |")
        for k, v in p["native"].items():
            print(f"| native {k} | {v['ms_per_step']:.2f} | {v['calls_per_step']} calls |")
        for op in p["top_aten"]:
            print(f"| {op['op']} | {op['self_ms_per_step']:.2f} | {op['share']:.1%} ({op['calls_per_step']} calls) |")


if __name__ == "__main__":
    main()
