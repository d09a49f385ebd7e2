"""The finishing of one DT attempt, phase by phase, and the float64 precision pass's L-BFGS
objective on the torch reference vs the native float64 sub-MLP bank, side by side in one run.

    python bench/dt_finish.py [--tasks parity_last2:0,max_last3:1] [--rounds 5] [--no-train]

Per task:rung: train the attempt as discover does (unless --no-train: then the phases run on the
untrained, frozen model, which times the same computations but solves nothing), then CPU seconds
of finish (head refit + float32 polish), evaluate, precision pass, and `extract` + `verify` of
the best replica. Then, on that model, one evaluation of the precision pass's objective (forward +
backward in float64 over POLISH_SEQUENCES, PRECISION_REPLICAS replicas, pointers pinned), timed in
interleaved rounds with WTC_KERNELS=reference and the default (native) backend; the two gradients
are compared. One torch thread. Results: bench/results/dt_finish.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import wtc
from wtc.discovery import REPLICAS_TO_READ
from wtc.dt import DTConfig
from wtc.dt.attempt import POLISH_SEQUENCES, PRECISION_REPLICAS, Attempt, take_replica
from wtc.dt.scores import rank_key
from wtc.dt.finish import masked_mse
from wtc.dt.selection import EVAL
from wtc.extraction import extract, verify

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, stamp  # noqa: E402

OUT = RESULTS / "dt_finish.json"


def cpu_seconds(fn):
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def phases(run: Attempt, train: bool) -> dict:
    """CPU seconds of each phase of one attempt, as wtc.dt.attempt.run_attempt + DiscoverJob run them."""
    out = {}
    if train:
        def steps():
            while run.phase in ("anneal", "hard"):
                run.train_step()
        _, out["train"] = cpu_seconds(steps)
    _, out["finish"] = cpu_seconds(run.finish)
    out["of_which_snap"], out["snapped"] = run.snap_seconds, [f"{s.replica}:{s.head}" for s in run.snaps]
    scores, out["evaluate"] = cpu_seconds(lambda: run.evaluate(run.config.eval_sequences))
    scores, out["precision"] = cpu_seconds(lambda: run.precision_pass(scores))
    run.history.final = {"scores": scores}
    out["replicas_solved"] = sum(bool(s["solved"]) for s in scores)
    order = sorted(range(len(scores)), key=lambda i: rank_key(run.task, scores[i]), reverse=True)
    out["extract"], out["verify"], out["verified"] = 0.0, 0.0, False
    for r in order[:REPLICAS_TO_READ]:
        model, _ = take_replica(run, r)
        try:
            program, t = cpu_seconds(lambda: extract(model, run.task, seed=0))
        except wtc.errors.ExtractionError:
            continue
        out["extract"] += t
        ver, t = cpu_seconds(lambda: verify(program, run.task, n=10000, seed=1))
        out["verify"] += t
        if ver.solved and program.ok:
            out["verified"] = True
            break
    return out


def objective_rounds(run: Attempt, rounds: int) -> dict:
    """ms per evaluation of the precision pass's objective, reference vs native float64, on the
    attempt's worst replicas (a solved replica's gradients are ~0 and compare nothing)."""
    scores = run.history.final["scores"]
    worst = sorted(range(len(scores)), key=lambda i: rank_key(run.task, scores[i]))[:PRECISION_REPLICAS]
    sub = run.model.select_replicas(worst).double()
    x, y, valid = (t[:POLISH_SEQUENCES].double() for t in run.fit_data[:3])
    params = [p for b in sub.blocks if b.mlp is not None for p in b.mlp.parameters_of_map()] + [sub.W_out, sub.b_out]

    def evaluation():
        loss = masked_mse(sub(x, EVAL)[0], y, valid).sum()
        return torch.autograd.grad(loss, params)

    times, grads = {"reference": [], "native": []}, {}
    with sub.pinned_pointers(x):
        for _ in range(rounds):
            for backend in times:
                if backend == "reference":
                    os.environ["WTC_KERNELS"] = "reference"
                else:
                    os.environ.pop("WTC_KERNELS", None)
                t = time.perf_counter()
                for _ in range(3):
                    g = evaluation()
                times[backend].append((time.perf_counter() - t) / 3 * 1e3)
                grads[backend] = g
    os.environ.pop("WTC_KERNELS", None)
    n_mlp = len(params) - 2          # the sub-MLP parameters (the head's two come last)
    diff = max(float((a - b).abs().max()) for a, b in zip(grads["native"][:n_mlp], grads["reference"][:n_mlp]))
    scale = max(float(b.abs().max()) for b in grads["reference"][:n_mlp])
    ref, nat = statistics.median(times["reference"]), statistics.median(times["native"])
    return {"reference_ms": ref, "native_ms": nat, "ratio": ref / nat, "mlp_grad_max": scale,
            "mlp_grad_max_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="parity_last2:0,max_last3:1", help="task:rung pairs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-train", action="store_true", help="time the phases on the untrained model")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for item in args.tasks.split(","):
        name, rung = item.split(":")
        task = wtc.tasks.get(name)
        label, config = DTConfig().rung(int(rung))
        run = Attempt(task, config, 0, int(rung))
        row = {"when": stamp(), "machine": machine(), "load": os.getloadavg()[0], "task": name, "rung": label,
               **phases(run, not args.no_train)}
        row.update(objective_rounds(run, args.rounds))
        print(json.dumps({k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        rows.append(row)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(OUT.read_text()) if OUT.exists() else []
    OUT.write_text(json.dumps(previous + rows, indent=1))


if __name__ == "__main__":
    main()
