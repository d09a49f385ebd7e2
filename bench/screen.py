"""Screening every weight (issue 39): estimators side by side against the exact scan of every
matrix weight, and the screen's throughput against the exact scan's.

Models (bench/screen_models.py): a wtc Transformer and a GPT-2-architecture `transformers` model,
both trained briefly; their exact scans come from `python -m bench.screen_models wtc gpt2`
(resumable, minutes each), read here from runs/screen_bench/exact_<model>.npz.

Estimators of each weight's total KL:
    magnitude       w^2 (no model pass at all: the baseline any screen must beat)
    fisher_seq      wtc.scan.fisher_estimate: 1/2 w^2 F_ii, one backward per sequence and draw (4 draws)
    screen_k        wtc.scan.screen: the same quantity, per-sequence gradients vmap'd over blocks, k draws
Figures per model and parameter kind (embedding, attention, MLP, unembedding; GPT-2's wte is both
the embedding and the tied head, kind "embedding+head"): Spearman with the exact total KL over the
nonzero weights, recall of the exact top 1% / 0.1% within the estimate's top 1% / 5%, seconds.

Throughput (--throughput): a 10M-parameter GPT-2 architecture (d 256, 10 layers, vocab 8192,
16 x 128 tokens): the whole screen timed, the exact scan timed on a sample of weights of three
parameters (early, middle, embedding); per-weight rates and their ratio.

    python -m bench.screen [--threads 2] [--throughput]
Writes bench/results/screen.csv and screen_throughput.csv (appended) and prints markdown tables.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from scipy.stats import spearmanr

from bench.common import append_rows, cpu_flags, machine, stamp
from bench.screen_models import MODELS, exact_npz, scan_tokens
from wtc.scan import fisher_estimate, scan, screen


def kind(name: str) -> str:
    if name in ("transformer.wte.weight",):
        return "embedding+head"                     # GPT-2 ties its head to the token embedding
    if "unembed" in name or "lm_head" in name:
        return "unembedding"
    if "embed" in name or name.startswith(("transformer.wte", "transformer.wpe")):
        return "embedding"
    if "attn" in name:
        return "attention"
    if "mlp" in name:
        return "MLP"
    return "other"


def recall(exact: np.ndarray, est: np.ndarray, top: float, within: float) -> float | None:
    """Share of the exact top `top` (fraction) that the estimate ranks within its top `within`."""
    n = len(exact)
    k_true, k_est = max(1, int(round(top * n))), max(1, int(round(within * n)))
    if n < 2:
        return None
    truth = np.argsort(-exact, kind="stable")[:k_true]
    chosen = np.zeros(n, bool)
    chosen[np.argsort(-est, kind="stable")[:k_est]] = True
    return float(chosen[truth].mean())


def metrics(exact: np.ndarray, est: np.ndarray) -> dict:
    sp = spearmanr(est, exact)[0] if len(exact) > 2 else float("nan")
    return {"weights": len(exact), "spearman": round(float(sp), 4),
            "recall_top1_in_1": recall(exact, est, 0.01, 0.01), "recall_top1_in_5": recall(exact, est, 0.01, 0.05),
            "recall_top01_in_1": recall(exact, est, 0.001, 0.01), "recall_top01_in_5": recall(exact, est, 0.001, 0.05)}


def compare(which: str, samples_list: list[int]) -> list[dict]:
    build, readout = MODELS[which]
    model = build()
    tokens = scan_tokens()
    exact = dict(np.load(exact_npz(which)))
    names = list(exact)
    params = dict(model.named_parameters())
    estimates, seconds = {}, {}
    estimates["magnitude"] = {n: params[n].detach().double() ** 2 for n in names}
    seconds["magnitude"] = 0.0
    t = time.perf_counter()
    estimates["fisher_seq (4 draws)"] = fisher_estimate(model, tokens, names, readout=readout, samples=4)
    seconds["fisher_seq (4 draws)"] = time.perf_counter() - t
    for k in samples_list:
        t = time.perf_counter()
        estimates[f"screen k={k}"] = screen(model, tokens, names, readout=readout, samples=k, progress=False)
        seconds[f"screen k={k}"] = time.perf_counter() - t
    rows = []
    groups = {"all": names}
    for n in names:
        groups.setdefault(kind(n), []).append(n)
    for est_name, est in estimates.items():
        for group, members in groups.items():
            x = np.concatenate([exact[n].flatten() for n in members])
            e = np.concatenate([est[n].detach().double().cpu().numpy().flatten() for n in members])
            w = np.concatenate([params[n].detach().cpu().numpy().flatten() for n in members])
            keep = w != 0
            rows.append({"model": which, "estimator": est_name, "kind": group, **metrics(x[keep], e[keep]),
                         "seconds": round(seconds[est_name], 2)})
        print(rows[-len(groups)], flush=True)
    return rows


def throughput(args) -> list[dict]:
    from transformers import GPT2LMHeadModel
    from bench.screen_models import gpt2_config, gpt2_readout

    torch.manual_seed(0)
    model = GPT2LMHeadModel(gpt2_config(d=256, layers=10, heads=8, vocab=8192, ctx=128)).eval()
    n_weights = sum(p.numel() for p in model.parameters() if p.ndim >= 2)
    tokens = torch.randint(0, 8192, (16, 128), generator=torch.Generator().manual_seed(0))
    t = time.perf_counter()
    est = screen(model, tokens, readout=gpt2_readout, samples=args.throughput_samples, progress=True)
    t_screen = time.perf_counter() - t
    sample = ["transformer.h.0.mlp.c_fc.weight", "transformer.h.5.attn.c_attn.weight", "transformer.wte.weight"]
    params = dict(model.named_parameters())
    masks = {}
    for n in sample:
        m = torch.zeros(params[n].numel(), dtype=torch.bool)
        m[torch.randperm(params[n].numel(), generator=torch.Generator().manual_seed(1))[:args.exact_sample]] = True
        masks[n] = m.reshape(params[n].shape)
    t = time.perf_counter()
    res = scan(model, tokens, params=sample, readout=gpt2_readout, weights=masks, progress=True, keep_positions=False)
    t_exact = time.perf_counter() - t
    exact_rate = res.weights_scanned / t_exact
    screen_rate = n_weights / t_screen
    row = {"model": f"GPT-2 arch d256 10 layers V8192 ({n_weights} matrix weights), 16x128 tokens",
           "estimator": f"screen k={args.throughput_samples}", "kind": "throughput", "weights": n_weights,
           "screen_seconds": round(t_screen, 1), "screen_w_per_s": round(screen_rate, 1),
           "exact_w_per_s": round(exact_rate, 3), "exact_weights_timed": res.weights_scanned,
           "exact_seconds": round(t_exact, 1), "ratio": round(screen_rate / exact_rate, 1),
           "finite": bool(all(torch.isfinite(e).all() for e in est.values()))}
    print(row, flush=True)
    return [row]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="wtc,gpt2")
    ap.add_argument("--samples", default="1,4,16", help="label draws of the screens compared")
    ap.add_argument("--throughput", action="store_true", help="also time the 10M-parameter GPT-2 screen")
    ap.add_argument("--throughput-samples", type=int, default=4)
    ap.add_argument("--exact-sample", type=int, default=4, help="weights per parameter timed with the exact scan")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for which in [m for m in args.models.split(",") if m]:
        rows += compare(which, [int(s) for s in args.samples.split(",")])
    if args.throughput:
        rows += throughput(args)
    load = os.getloadavg()[0]
    for r in rows:
        r.update({"date": stamp(), "machine": machine(), "cpu": cpu_flags(), "threads": args.threads,
                  "load1": round(load, 1)})
    compared = [r for r in rows if r["kind"] != "throughput"]
    path = append_rows("screen", compared) if compared else None
    if len(compared) < len(rows):               # other columns: a file of its own
        append_rows("screen_throughput", [r for r in rows if r["kind"] == "throughput"])
    print("\n| model | estimator | kind | weights | Spearman | top1% in 1% | top1% in 5% | top0.1% in 1% | top0.1% in 5% | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"           # noqa: E731
    for r in rows:
        if r["kind"] != "throughput":
            print(f"| {r['model']} | {r['estimator']} | {r['kind']} | {r['weights']} | {r['spearman']:.3f} | "
                  f"{fmt(r['recall_top1_in_1'])} | {fmt(r['recall_top1_in_5'])} | {fmt(r['recall_top01_in_1'])} | "
                  f"{fmt(r['recall_top01_in_5'])} | {r['seconds']} |")
    print(f"\n(appended to {path})")


if __name__ == "__main__":
    main()
