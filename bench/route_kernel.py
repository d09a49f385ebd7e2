"""The DT's routing op and training step, this checkout vs an earlier installation, per instruction set.

    python bench/route_kernel.py --before /tmp/venv-before/bin/python [--isas auto,avx2,portable]
                                 [--rounds 5] [--reps 20]

What it measures, for each installation (--before: another interpreter with an earlier wtc installed,
e.g. `git worktree add /tmp/before <commit>`, a venv with `--system-site-packages` and `pip install
--no-deps -e /tmp/before`; --now: this one) and each native instruction set (WTC_NATIVE_ISA, read
when wtc._C loads, so each (installation, ISA) pair runs in its own subprocess):
- the route op alone, forward and backward through autograd (wtc.kernels.cpu.route, the op the CPU
  training step calls), on the default DT's inputs for parity_last2: R = 8 replicas of which 2 score
  content, B = 128 sequences, H = 3 heads, T = 10, 9 pads, 16 PLE bins; in the annealing's mode (soft,
  Gumbel noise, the heads' overlaps) and the hard phase's (argmax, straight-through gradients);
- the whole training step (Attempt.train_step, 1 thread) in both phases.
Rounds are interleaved (each round runs every pair once, the order rotating) and the median over rounds
of each pair's mean is reported, with ratios before / now taken within the run: the machine is
shared, absolute times drift, ratios much less. Writes bench/results/<--out>.json and prints a markdown
table with the CPU's flags.
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
from common import RESULTS, cpu_flags, machine, neutral_cwd, stamp  # noqa: E402

PROBE = r"""
import json, sys, time
import numpy as np, torch
import wtc
from wtc.dt import DTConfig
from wtc.dt.attempt import Attempt
from wtc.kernels import cpu
from wtc.threads import torch_threads
import wtc.tasks

reps = int(sys.argv[1])
out = {"wtc": wtc.__file__}
R, B, H, T, P, N = 8, 128, 3, 10, 9, 16
L = T + P
rng = np.random.default_rng(0)
f = lambda *s: torch.as_tensor(rng.random(s, dtype=np.float32))
inputs = [f(R, B, H, T), f(R, B, H, L), f(R, B, H, L), 0.3 * f(R, H, N, N), 0.3 * f(R, H, N), f(R, H, L), f(R, H, L),
          f(R, H) + 0.5]
content = torch.tensor([1, 1, 0, 0, 0, 0, 0, 0], dtype=torch.float32)
modes = {"anneal": dict(hard=False, straight_through=False, seed=1234, overlap=True),
         "hard": dict(hard=True, straight_through=True, seed=None, overlap=False)}
with torch_threads(1):
    for phase, kw in modes.items():
        leaves = [x.clone().requires_grad_() for x in inputs]
        def op():
            o, ov = cpu.route(*leaves, content, pad=P, tau=0.7, **kw)
            loss = o.sum() + (ov.sum() if ov is not None else 0)
            loss.backward()
        for _ in range(3):
            op()
        t = time.perf_counter()
        for _ in range(reps):
            op()
        out[f"route {phase}"] = (time.perf_counter() - t) / reps * 1e3
    task = wtc.tasks.get("parity_last2")
    for phase in ("anneal", "hard"):
        run = Attempt(task, DTConfig(), seed=0, attempt=0)
        if phase == "hard":
            run.phase, run.step = "hard", run.config.steps
        for _ in range(3):
            run.train_step()
        t = time.perf_counter()
        for _ in range(reps):
            run.train_step()
        out[f"step {phase}"] = (time.perf_counter() - t) / reps * 1e3
print(json.dumps(out))
"""

KEYS = ("route anneal", "route hard", "step anneal", "step hard")


def probe(python: str, isa: str, reps: int) -> dict:
    env = {**os.environ, "WTC_NATIVE_ISA": isa}
    proc = subprocess.run([python, "-c", PROBE, str(reps)], capture_output=True, text=True, env=env, cwd=neutral_cwd())
    if proc.returncode != 0:
        raise SystemExit(f"{python} with WTC_NATIVE_ISA={isa} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="python of the earlier installation")
    ap.add_argument("--now", default=sys.executable, help="python of this checkout (default: this one)")
    ap.add_argument("--isas", default="auto,avx2,portable", help="WTC_NATIVE_ISA values, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20, help="op calls / steps per measurement")
    ap.add_argument("--out", default="route_kernel", help="bench/results/<out>.json")
    args = ap.parse_args()
    isas = [i.strip() for i in args.isas.split(",") if i.strip()]
    pairs = [(engine, isa) for isa in isas for engine in ("before", "now")]
    python = {"before": args.before, "now": args.now}
    runs: dict[tuple[str, str], list[dict]] = {p: [] for p in pairs}
    for k in range(args.rounds):
        for engine, isa in pairs[k % len(pairs):] + pairs[:k % len(pairs)]:
            runs[(engine, isa)].append(probe(python[engine], isa, args.reps))
        print(f"round {k + 1}/{args.rounds} done", file=sys.stderr)
    med = {p: {key: statistics.median(r[key] for r in rs) for key in KEYS} for p, rs in runs.items()}
    report = {"stamp": stamp(), "machine": machine(), "cpu": cpu_flags(), "load": os.getloadavg(),
              "before": args.before, "now": args.now, "rounds": args.rounds, "reps": args.reps,
              "median_ms": {f"{e} {i}": v for (e, i), v in med.items()},
              "runs": {f"{e} {i}": rs for (e, i), rs in runs.items()}}
    path = RESULTS / f"{args.out}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"{report['cpu']}; {args.rounds} rounds x {args.reps} reps; load {report['load'][0]:.1f}\n")
    print("| WTC_NATIVE_ISA | " + " | ".join(f"{k}: before / now ms (ratio)" for k in KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    for isa in isas:
        b, n = med[("before", isa)], med[("now", isa)]
        cells = [f"{b[k]:.2f} / {n[k]:.2f} ({b[k] / n[k]:.2f}x)" for k in KEYS]
        print(f"| {isa} | " + " | ".join(cells) + " |")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
