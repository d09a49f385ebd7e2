"""Per-weight ablation throughput, side by side in one run (ratios; this machine is noisy).

Model: 2-layer transformer, d_model 128, 4 heads, d_mlp 512, vocab 512, over 64 x 128 tokens.
- naive loop: zero one weight, full forward, restore (wtc.scan.reference), on a sample of weights;
- exact batched: wtc.scan.engine on a sample of each matrix (the other weights zeroed for the
  timing, so the scan skips them); rates exclude the one-time clean pass of each method (its own
  row), as in a scan of whole parameters;
- closed form: the unembedding (all d_model x vocab weights);
- KL: torch eager (float64 log_softmax) vs wtc._C.kl_rows on (A, N, V) ablated logits; on a GPU
  (--device cuda) the Triton kl_rows vs torch eager and against a device copy's bandwidth.
Writes bench/results/ablation.csv and prints a markdown table.

    python -m bench.ablation [--threads 2] [--naive 16] [--sample 192] [--params a,b]
"""
from __future__ import annotations

import argparse
import time

import torch

from bench.common import append_rows, machine, stamp
from wtc import _native
from wtc.scan import kl as K
from wtc.scan import scan
from wtc.scan.reference import naive_position_kl
from wtc.models import Transformer, TransformerConfig


def timed(fn, repeat=1):
    best = float("inf")
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best, out


def sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--naive", type=int, default=16, help="weights timed with the naive loop per parameter")
    ap.add_argument("--sample", type=int, default=192, help="weights timed with the batched scan per parameter")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (on a GPU the scan runs its torch path; "
                    "the native KL rows are CPU-only and skipped)")
    ap.add_argument("--params", default=None, help="comma-separated subset of the exact rows (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TransformerConfig(n_layers=2, d_model=128, n_heads=4, d_head=32, d_mlp=512, d_vocab=512, n_ctx=128)
    model = Transformer(cfg, seed=0).eval().to(args.device)
    tokens = torch.randint(0, cfg.d_vocab, (64, 128), generator=torch.Generator().manual_seed(0)).to(args.device)
    rows = []

    # every nonzero matrix except the unembedding (closed form, timed below on all its weights); the
    # (H, d_head) attention biases start at zero, so a scan skips them
    params = [n for n, p in model.named_parameters() if p.ndim >= 2 and n != "unembed.W_U" and bool((p != 0).any())]
    if args.params:
        params = args.params.split(",")
    sizes, naive_rates, fast_rates = {}, {}, {}
    # One-time work, timed apart so the rates are per weight, as in a scan of whole parameters:
    # the naive loop's clean forward, and the scan's clean pass with its caches (scan of no weight).
    first = params[0]
    none = {first: torch.zeros_like(dict(model.named_parameters())[first], dtype=torch.bool)}
    with torch.no_grad():
        t_naive_setup, _ = timed(lambda: model(tokens), repeat=3)
    t_setup, _ = timed(lambda: scan(model, tokens, params=[first], weights=none, progress=False,
                                    keep_positions=False), repeat=3)
    rows.append({"what": "one-time: clean forward (naive) | clean pass and caches (scan), seconds",
                 "naive_w_per_s": round(t_naive_setup, 3), "fast_w_per_s": round(t_setup, 3), "speedup": ""})
    for name in params:
        p = dict(model.named_parameters())[name]
        idx = list(range(0, p.numel(), max(1, p.numel() // args.naive)))[: args.naive]
        t_naive, _ = timed(lambda: naive_position_kl(model, tokens, name, flat_indices=idx))
        naive_wps = len(idx) / max(t_naive - t_naive_setup, 1e-9)
        # batched: a sample of the parameter's weights. Embedding rows differ in cost (how often
        # the token occurs, where the row starts), so those are drawn at random; elsewhere every
        # weight costs the same and the sample is a run of consecutive weights from a random
        # start, so it is batched as in a scan of the whole parameter (random weights would be
        # spread over many chunks, each a small batch).
        sub = {name: p}
        keep = p.detach().clone()
        g = torch.Generator().manual_seed(1)
        if name in ("embed.W_E", "pos_embed.W_pos"):
            chosen = torch.randperm(p.numel(), generator=g)[: args.sample]
        else:
            start = int(torch.randint(0, max(1, p.numel() - args.sample), (1,), generator=g))
            chosen = torch.arange(start, min(start + args.sample, p.numel()))
        chosen = chosen.to(p.device)
        with torch.no_grad():                      # scan only a sample: zero the rest (zeros are skipped)
            flat = p.data.view(-1)
            mask = torch.zeros(p.numel(), dtype=torch.bool, device=p.device)
            mask[chosen] = True
            flat[~mask] = 0
        try:
            t_batch, res = timed(lambda: scan(model, tokens, params=list(sub), progress=False, keep_positions=False))
        finally:
            with torch.no_grad():
                p.data.copy_(keep)
        batched_wps = res.weights_scanned / max(t_batch - t_setup, 1e-9)
        sizes[name], naive_rates[name], fast_rates[name] = p.numel(), naive_wps, batched_wps
        rows.append({"what": f"exact {name}", "naive_w_per_s": round(naive_wps, 2),
                     "fast_w_per_s": round(batched_wps, 2), "speedup": round(batched_wps / naive_wps, 2)})
        print(rows[-1], flush=True)

    # closed form on the whole unembedding vs the naive loop on a sample of it
    idx = list(range(0, cfg.d_model * cfg.d_vocab, 997))[: args.naive]
    t_naive, _ = timed(lambda: naive_position_kl(model, tokens, "unembed.W_U", flat_indices=idx))
    t_closed, res = timed(lambda: scan(model, tokens, params="unembed.W_U", progress=False, keep_positions=False))
    naive_wps = len(idx) / max(t_naive - t_naive_setup, 1e-9)
    closed_wps = res.weights_scanned / max(t_closed - t_setup, 1e-9)
    sizes["unembed.W_U"], naive_rates["unembed.W_U"], fast_rates["unembed.W_U"] = res.weights_scanned, naive_wps, closed_wps
    rows.append({"what": "closed form unembed.W_U", "naive_w_per_s": round(naive_wps, 2),
                 "fast_w_per_s": round(closed_wps, 2), "speedup": round(closed_wps / naive_wps, 1)})
    print(rows[-1], flush=True)

    # whole model: time per weight weighted by parameter size (derived from the rates above)
    if not args.params:
        t_naive_all = t_naive_setup + sum(sizes[n] / naive_rates[n] for n in sizes)
        t_fast_all = t_setup + sum(sizes[n] / fast_rates[n] for n in sizes)
        rows.append({"what": f"whole model ({sum(sizes.values())} weights; derived: one-time + sum of size / rate)",
                     "naive_w_per_s": round(sum(sizes.values()) / t_naive_all, 2),
                     "fast_w_per_s": round(sum(sizes.values()) / t_fast_all, 2),
                     "speedup": round(t_naive_all / t_fast_all, 2)})
        print(rows[-1], flush=True)

    # The floor of any exact method for a weight whose change reaches the last residual stream as a
    # dense (N, D) matrix (every weight before the last block's MLP): the ablated logits need one
    # (N, D) x (D, V) GEMM and the KL reads all N x V of them. Timed here in batches of 2 with
    # reused buffers, against the naive loop's mean rate: the largest speed-up those weights allow.
    if not args.params and args.device == "cpu":
        N, D = tokens.numel(), cfg.d_model
        logp = torch.log_softmax(model(tokens).detach().double(), -1).float().reshape(N, cfg.d_vocab)
        hidden = torch.randn(2 * N, D)
        out = torch.empty(2 * N, cfg.d_vocab)
        W_U, b_U = model.unembed.W_U.detach(), model.unembed.b_U.detach()

        def floor():
            K.kl_rows(logp, torch.addmm(b_U, hidden, W_U, out=out).view(2, N, cfg.d_vocab))
        t_floor, _ = timed(floor, repeat=5)
        t_gemm, _ = timed(lambda: torch.addmm(b_U, hidden, W_U, out=out), repeat=5)
        naive_mean = sum(sizes[n] for n in sizes) / sum(sizes[n] / naive_rates[n] for n in sizes)
        rows.append({"what": "floor: unembedding GEMM + KL of a dense change (upper bound for weights before the last MLP)",
                     "naive_w_per_s": round(naive_mean, 2), "fast_w_per_s": round(2 / t_floor, 2),
                     "speedup": round(2 / t_floor / naive_mean, 2)})
        rows.append({"what": "floor without the KL: the unembedding GEMM alone (a free KL)",
                     "naive_w_per_s": round(naive_mean, 2), "fast_w_per_s": round(2 / t_gemm, 2),
                     "speedup": round(2 / t_gemm / naive_mean, 2)})
        print(rows[-2:], flush=True)

    # KL kernel: torch eager vs native on A=16 ablations of N = 8192 positions, V = 512
    if _native.cpu_module() is not None and args.device == "cpu":
        _native.cpu_module().set_num_threads(args.threads)
        logits = model(tokens).detach().reshape(-1, cfg.d_vocab)
        logp = torch.log_softmax(logits.double(), -1)        # float64, as the scan passes it
        logp32 = logp.float()
        ablated = logits[None] + 0.1 * torch.randn(16, *logits.shape)
        t_eager, _ = timed(lambda: K.kl_rows_reference(logp, ablated), repeat=3)
        t_eager32, _ = timed(lambda: (logp32.exp() * (logp32 - torch.log_softmax(ablated, -1))).sum(-1), repeat=3)
        t_native, _ = timed(lambda: K.kl_rows(logp, ablated), repeat=3)
        gb = ablated.numel() * 4 / 1e9
        rows.append({"what": "kl_rows A=16 N=8192 V=512 (GB/s torch f64 | f32 -> native)",
                     "naive_w_per_s": round(gb / t_eager, 2), "fast_w_per_s": round(gb / t_native, 2),
                     "speedup": round(t_eager / t_native, 2)})
        rows.append({"what": "kl_rows vs torch float32 eager", "naive_w_per_s": round(gb / t_eager32, 2),
                     "fast_w_per_s": round(gb / t_native, 2), "speedup": round(t_eager32 / t_native, 2)})
        print(rows[-2:], flush=True)

    # GPU: the Triton KL (wtc.kernels.kl) vs torch eager, and its bandwidth against a device copy
    if args.device == "cuda":
        from wtc.kernels.kl import kl_rows as triton_kl_rows
        A = 64
        logits = model(tokens).detach().reshape(-1, cfg.d_vocab)
        logp = torch.log_softmax(logits.double(), -1)
        ablated = logits[None] + 0.1 * torch.randn(A, *logits.shape, device=logits.device)
        t_eager, _ = timed(lambda: K.kl_rows_reference(logp, ablated), repeat=5)
        logp32 = logp.float()
        t_eager32, _ = timed(lambda: (logp32.exp() * (logp32 - torch.log_softmax(ablated, -1))).sum(-1), repeat=5)
        t_triton, _ = timed(lambda: triton_kl_rows(logp, ablated), repeat=5)
        t_copy, _ = timed(lambda: ablated.clone(), repeat=5)
        bytes_kl = ablated.numel() * 4 + logp.numel() * 8 + A * logits.shape[0] * 8
        copy_gbs = 2 * ablated.numel() * 4 / t_copy / 1e9
        rows.append({"what": f"GPU kl_rows A={A} N={logits.shape[0]} V={cfg.d_vocab}: GB/s torch f64 eager -> Triton",
                     "naive_w_per_s": round(bytes_kl / t_eager / 1e9, 1), "fast_w_per_s": round(bytes_kl / t_triton / 1e9, 1),
                     "speedup": round(t_eager / t_triton, 2)})
        rows.append({"what": "GPU kl_rows: torch f32 eager -> Triton", "naive_w_per_s": round(bytes_kl / t_eager32 / 1e9, 1),
                     "fast_w_per_s": round(bytes_kl / t_triton / 1e9, 1), "speedup": round(t_eager32 / t_triton, 2)})
        rows.append({"what": "GPU kl_rows: device copy (read + write) GB/s -> Triton GB/s (fraction)",
                     "naive_w_per_s": round(copy_gbs, 1), "fast_w_per_s": round(bytes_kl / t_triton / 1e9, 1),
                     "speedup": round(bytes_kl / t_triton / 1e9 / copy_gbs, 3)})
        print(rows[-3:], flush=True)

    for r in rows:
        r.update({"date": stamp(), "machine": machine(), "threads": args.threads, "device": args.device})
    path = append_rows("ablation" if args.device == "cpu" else f"ablation_{args.device}", rows)
    print(f"\n| what | baseline | wtc | ratio |\n|---|---|---|---|")
    for r in rows:
        ratio = f"{r['speedup']}x" if r["speedup"] != "" else "-"
        print(f"| {r['what']} | {r['naive_w_per_s']} | {r['fast_w_per_s']} | {ratio} |")
    print(f"\n(appended to {path})")


if __name__ == "__main__":
    main()
