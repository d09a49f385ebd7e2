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

Throughput (--throughput): a 10M-parameter GPT-2 architecture (--arch; default d 256, 10 layers,
vocab 8192, 16 x 128 tokens): the whole screen timed, the exact scan timed on a sample of weights of
three parameters (early, middle, embedding); per-weight rates and their ratio.

Confirmation (--confirm K): on the same architecture, what `scan(..., screen=K)` does as a user runs
it: the screen (timed alone, its state kept), then the exact scan of its top K plus --confirm-random
weights drawn uniformly (timed: the resumed screen is read back, not recomputed), and the report's
Spearman / recall on the random sample.

--device cuda runs the models, the screens and the exact scans on the GPU (TF32 off: exact float32
products; times synchronised); the exact totals for the comparison then come from --exact-dir
(`python -m bench.screen_models --device cuda --npz DIR wtc gpt2`). fisher_seq (the one-sequence-
at-a-time baseline) runs on the CPU only.

    python -m bench.screen [--threads 2] [--throughput] [--confirm K] [--device cuda] [--exact-dir DIR]
Writes bench/results/screen[_DEVICE].csv, screen_throughput[_DEVICE].csv and screen_confirm[_DEVICE].csv
(appended; no suffix on the CPU) and prints markdown tables.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import append_rows, cpu_flags, machine, stamp
from bench.screen_models import MODELS, exact_npz, scan_tokens
from wtc.scan import fisher_estimate, scan, screen
from wtc.scan.screened import spearman

DEFAULT_ARCH = "256,10,8,8192,128,16"     # d_model, layers, heads, vocab, tokens per sequence, sequences


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn):
    """(fn(), seconds), the device synchronised on both sides."""
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


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
    sp = spearman(est, exact)
    return {"weights": len(exact), "spearman": round(float("nan") if sp is None else sp, 4),
            "recall_top1_in_1": recall(exact, est, 0.01, 0.01), "recall_top1_in_5": recall(exact, est, 0.01, 0.05),
            "recall_top01_in_1": recall(exact, est, 0.001, 0.01), "recall_top01_in_5": recall(exact, est, 0.001, 0.05)}


def compare(which: str, samples_list: list[int], device: str = "cpu", exact_dir: Path | None = None) -> list[dict]:
    build, readout = MODELS[which]
    model = build().to(device)
    tokens = scan_tokens().to(device)
    exact = dict(np.load(exact_npz(which) if exact_dir is None else exact_dir / f"exact_{which}.npz"))
    names = list(exact)
    params = dict(model.named_parameters())
    estimates, seconds = {}, {}
    estimates["magnitude"] = {n: params[n].detach().double() ** 2 for n in names}
    seconds["magnitude"] = 0.0
    if device == "cpu":
        estimates["fisher_seq (4 draws)"], seconds["fisher_seq (4 draws)"] = timed(
            device, lambda: fisher_estimate(model, tokens, names, readout=readout, samples=4))
    for k in samples_list:
        estimates[f"screen k={k}"], seconds[f"screen k={k}"] = timed(
            device, lambda: screen(model, tokens, names, readout=readout, samples=k, progress=False))
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
                         "seconds": round(seconds[est_name], 2), **({} if device == "cpu" else {"device": device})})
        print(rows[-len(groups)], flush=True)
    return rows


def arch_model(arch: str, device: str, family: str = "gpt2"):
    """(model of random weights on `device`, its tokens, matrix weights, a description, its readout,
    three parameters to time exactly: early MLP, middle attention, embedding) for --arch: a
    `transformers` GPT-2 or a wtc Transformer (no `transformers` needed: the GPU image lacks it)."""
    d, layers, heads, vocab, ctx, sequences = (int(v) for v in arch.split(","))
    torch.manual_seed(0)
    if family == "gpt2":
        from transformers import GPT2LMHeadModel
        from bench.screen_models import gpt2_config, gpt2_readout

        model = GPT2LMHeadModel(gpt2_config(d=d, layers=layers, heads=heads, vocab=vocab, ctx=ctx))
        readout, sample = gpt2_readout, ["transformer.h.0.mlp.c_fc.weight",
                                         f"transformer.h.{layers // 2}.attn.c_attn.weight", "transformer.wte.weight"]
    else:
        from wtc.models import Transformer, TransformerConfig

        model = Transformer(TransformerConfig(n_layers=layers, d_model=d, n_heads=heads, d_head=d // heads, d_mlp=4 * d,
                                              d_vocab=vocab, n_ctx=ctx), seed=0)
        readout, sample = None, ["blocks.0.mlp.W_in", f"blocks.{layers // 2}.attn.W_Q", "embed.W_E"]
    model = model.eval().to(device)
    n_weights = sum(p.numel() for p in model.parameters() if p.ndim >= 2)
    tokens = torch.randint(0, vocab, (sequences, ctx), generator=torch.Generator().manual_seed(0)).to(device)
    what = (f"{'GPT-2' if family == 'gpt2' else 'wtc Transformer'} arch d{d} {layers} layers V{vocab} "
            f"({n_weights} matrix weights), {sequences}x{ctx} tokens")
    return model, tokens, n_weights, what, readout, sample


def throughput(args) -> list[dict]:
    model, tokens, n_weights, what, readout, sample = arch_model(args.arch, args.device, args.family)
    est, t_screen = timed(args.device, lambda: screen(model, tokens, readout=readout,
                                                      samples=args.throughput_samples, progress=True))
    params = dict(model.named_parameters())
    masks = {}
    for n in sample:
        m = torch.zeros(params[n].numel(), dtype=torch.bool)
        m[torch.randperm(params[n].numel(), generator=torch.Generator().manual_seed(1))[:args.exact_sample]] = True
        masks[n] = m.reshape(params[n].shape)
    res, t_exact = timed(args.device, lambda: scan(model, tokens, params=sample, readout=readout, weights=masks,
                                                   progress=True, keep_positions=False))
    exact_rate = res.weights_scanned / t_exact
    screen_rate = n_weights / t_screen
    row = {"model": what, "estimator": f"screen k={args.throughput_samples}", "kind": "throughput",
           **({} if args.device == "cpu" else {"device": args.device}), "weights": n_weights,
           "screen_seconds": round(t_screen, 1), "screen_w_per_s": round(screen_rate, 1),
           "exact_w_per_s": round(exact_rate, 3), "exact_weights_timed": res.weights_scanned,
           "exact_seconds": round(t_exact, 1), "ratio": round(screen_rate / exact_rate, 1),
           "finite": bool(all(torch.isfinite(e).all() for e in est.values()))}
    print(row, flush=True)
    return [row]


def confirm(args) -> list[dict]:
    """scan(..., screen=K) on --arch: the screen, then the exact confirmation, each timed."""
    model, tokens, n_weights, what, readout, _ = arch_model(args.arch, args.device, args.family)
    with tempfile.TemporaryDirectory(prefix="screen-confirm-") as out:
        # the screen alone, its state kept where scan(screen=) looks for it: the second call reads it back
        _, t_screen = timed(args.device, lambda: screen(model, tokens, None, readout, samples=4, seed=0,
                                                        out=Path(out) / "screen", progress=True))
        res, t_exact = timed(args.device, lambda: scan(model, tokens, readout=readout, out=out,
                                                       screen=args.confirm, screen_random=args.confirm_random,
                                                       keep_positions=False, progress=True))
    rep = res.screen
    row = {"model": what, "kind": "confirm", "device": args.device, "weights": n_weights, "top_k": rep.top_k,
           "random_sample": rep.random_sample, "exact_weights": res.weights_scanned,
           "screen_seconds": round(t_screen, 1), "confirm_seconds": round(t_exact, 1),
           "exact_w_per_s": round(res.weights_scanned / t_exact, 2),
           "spearman_random": None if rep.spearman_random is None else round(rep.spearman_random, 4),
           "spearman_top": None if rep.spearman_top is None else round(rep.spearman_top, 4),
           "recall_top1pct_in_screen_top5pct": rep.recall_top1pct_in_screen_top5pct,
           "missed_in_sample": rep.missed_in_sample, "note": rep.note}
    print(row, flush=True)
    return [row]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where the models, screens and exact scans run")
    ap.add_argument("--models", default="wtc,gpt2", help="models compared with their exact scans ('' for none)")
    ap.add_argument("--exact-dir", default=None, help="directory of exact_<model>.npz (default runs/screen_bench)")
    ap.add_argument("--samples", default="1,4,16", help="label draws of the screens compared")
    ap.add_argument("--throughput", action="store_true", help="also time the screen of --arch against exact weights")
    ap.add_argument("--arch", default=DEFAULT_ARCH, help="d_model,layers,heads,vocab,ctx,sequences of the GPT-2 "
                                                         f"architecture timed (default {DEFAULT_ARCH}: 10M weights)")
    ap.add_argument("--family", default="gpt2", choices=("gpt2", "wtc"), help="the --arch model: a transformers "
                    "GPT-2 (default) or a wtc Transformer")
    ap.add_argument("--throughput-samples", type=int, default=4)
    ap.add_argument("--exact-sample", type=int, default=4, help="weights per parameter timed with the exact scan")
    ap.add_argument("--confirm", type=int, default=None, metavar="K",
                    help="also run scan(..., screen=K) on --arch: the screen and the exact confirmation, timed")
    ap.add_argument("--confirm-random", type=int, default=200, help="the confirmation's uniform sample")
    ap.add_argument("--no-record", action="store_true", help="print only; append nothing to bench/results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):        # exact float32 products: no TF32 rounding in the exact KL
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    rows = []
    exact_dir = Path(args.exact_dir) if args.exact_dir else None
    for which in [m for m in args.models.split(",") if m]:
        rows += compare(which, [int(s) for s in args.samples.split(",")], args.device, exact_dir)
    if args.throughput:
        rows += throughput(args)
    if args.confirm is not None:
        rows += confirm(args)
    load = os.getloadavg()[0]
    for r in rows:
        r.update({"date": stamp(), "machine": machine(), "cpu": cpu_flags(), "threads": args.threads,
                  "load1": round(load, 1)})
        if args.device.startswith("cuda"):
            r["gpu"] = torch.cuda.get_device_name()
    suffix = "" if args.device == "cpu" else "_" + args.device.split(":")[0]
    for name, kinds in (("screen", None), ("screen_throughput", "throughput"), ("screen_confirm", "confirm")):
        chosen = [r for r in rows if r["kind"] == kinds or (kinds is None and r["kind"] not in ("throughput", "confirm"))]
        if chosen and not args.no_record:     # each kind of row has its own columns: a file each
            print(f"(appended to {append_rows(name + suffix, chosen)})")
    print("\n| model | estimator | kind | weights | Spearman | top1% in 1% | top1% in 5% | top0.1% in 1% | top0.1% in 5% | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"           # noqa: E731
    for r in rows:
        if r["kind"] not in ("throughput", "confirm"):
            print(f"| {r['model']} | {r['estimator']} | {r['kind']} | {r['weights']} | {r['spearman']:.3f} | "
                  f"{fmt(r['recall_top1_in_1'])} | {fmt(r['recall_top1_in_5'])} | {fmt(r['recall_top01_in_1'])} | "
                  f"{fmt(r['recall_top01_in_5'])} | {r['seconds']} |")


if __name__ == "__main__":
    main()
