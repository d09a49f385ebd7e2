"""Per-weight ablation throughput, side by side in one run (ratios; this machine is noisy).

Model: 2-layer transformer, d_model 128, 4 heads, d_mlp 512, vocab 512, over 64 x 128 tokens.
- naive loop: zero one weight, full forward, restore (wtc.scan.reference), on a sample of weights;
- exact batched: wtc.scan.engine on a sample of each matrix (the other weights zeroed for the
  timing, so the scan skips them); rates exclude the one-time clean pass of each method (its own
  row), as in a scan of whole parameters;
- closed form: the unembedding (all d_model x vocab weights);
- KL: torch eager (float64 log_softmax) vs wtc._C.kl_rows on (A, N, V) ablated logits; on a GPU
  (--device cuda) the Triton kl_rows vs torch eager and against a device copy's bandwidth.
- generic path (--section generic; any nn.Module with a readout, e.g. Hugging Face models):
  the naive loop vs the scan before (FORCE="vmap": parameter copies through torch.func.vmap, the
  only generic method until 2026-12) vs now (wtc.scan.generic's choice), interleaved rounds,
  medians; see generic_section.
Writes bench/results/ablation.csv (ablation_generic.csv for the generic rows) and prints a
markdown table.

    python -m bench.ablation [--threads 2] [--naive 16] [--sample 192] [--params a,b] [--section all|wtc|generic]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

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
    ap.add_argument("--section", default="all", choices=["all", "wtc", "generic"])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the generic section (medians)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.section == "generic":
        return generic_section(args)
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
    if args.section == "all":
        generic_section(args)


# ----------------------------------------------------------------------------- generic path
class MLP2(nn.Module):
    """Two weight matrices: one-hot tokens -> Linear(V, H) -> tanh -> Linear(H, V), logits centred
    (so the head is not the closed-form unembedding: both matrices take the generic path)."""

    def __init__(self, V, H):
        super().__init__()
        torch.manual_seed(0)
        self.V = V
        self.fc1, self.fc2 = nn.Linear(V, H), nn.Linear(H, V)

    def forward(self, ids):
        z = self.fc2(torch.tanh(self.fc1(torch.nn.functional.one_hot(ids, self.V).to(self.fc1.weight.dtype))))
        return z - z.mean(-1, keepdim=True)


def _gpt2(d, layers, heads, vocab, ctx):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=d, n_layer=layers, n_head=heads, vocab_size=vocab, n_positions=ctx)
    return GPT2LMHeadModel(cfg).eval()


def generic_cases():
    """(row name, model, tokens, readout, params, (weights timed per parameter: naive, scan) or
    None for a whole scan of every weight of the parameters, one-time costs included: the issue's
    comparison, parameters whose "now" is timed as a whole scan). A sampled run of an embedding's
    weights is not representative of its scan: rows of tokens the scan's tokens never look up skip
    to the tied head, so GPT-2's wte is scanned whole by "now" (the naive loop and vmap cost the
    same for every weight, so their samples are)."""
    g = torch.Generator().manual_seed(0)
    cases = [("MLP2 V13 H24, 8x16 tokens: whole scan of fc1 + fc2 (624 weights), one-time costs in",
              MLP2(13, 24).eval(), torch.randint(0, 13, (8, 16), generator=g), None,
              ["fc1.weight", "fc2.weight"], None, ()),
             ("MLP2 V512 H512, 64x128 tokens (compute-bound)", MLP2(512, 512).eval(),
              torch.randint(0, 512, (64, 128), generator=g), None, ["fc1.weight", "fc2.weight"], ((6, 1), (16, 1)), ())]
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: no GPT-2 rows (python -m pip install transformers)")
    else:
        readout = lambda out: out.logits                               # noqa: E731
        for title, (d, layers, vocab, B, T), sizes, whole in [
                ("GPT2LMHeadModel (random GPT2Config) d64 2 layers 4 heads V512, 8x32 tokens", (64, 2, 512, 8, 32),
                 ((16, 1), (256, 1)), ("transformer.wte.weight",)),
                ("GPT2LMHeadModel d32 5 layers 4 heads V1000 (the shape of Hugging Face's tiny test GPT-2), 8x32 tokens",
                 (32, 5, 1000, 8, 32), ((16, 1), (256, 1)), ("transformer.wte.weight",)),
                # 8192 tokens look up every one of the 512 rows: no row skips, a sample is representative
                ("GPT2LMHeadModel d128 2 layers 4 heads V512, 64x128 tokens (compute-bound)", (128, 2, 512, 64, 128),
                 ((6, 1), (12, 1)), ())]:
            model = _gpt2(d, layers, 4, vocab, T)
            mats = [n for n, p in model.named_parameters() if p.ndim >= 2]     # every matrix (wte is also the head)
            cases.append((title, model, torch.randint(0, vocab, (B, T), generator=g), readout, mats, sizes, whole))
    cfg = TransformerConfig(n_layers=2, d_model=128, n_heads=4, d_head=32, d_mlp=512, d_vocab=512, n_ctx=128)
    cases.append(("wtc Transformer d128 (the bench model) through the generic path, 64x128 tokens (raw parameters: no rows)",
                  Transformer(cfg, seed=0).eval(), torch.randint(0, 512, (64, 128), generator=g), lambda out: out + 0.0,
                  ["blocks.0.mlp.W_in", "blocks.1.attn.W_O"], ((6, 1), (12, 1)), ()))
    small = TransformerConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=16, n_ctx=16)
    cases.append(("wtc Transformer d16 through the generic path, 8x16 tokens (no rows: vmap vs naive)",
                  Transformer(small, seed=0).eval(), torch.randint(0, 16, (8, 16), generator=g), lambda out: out + 0.0,
                  ["blocks.0.mlp.W_in", "blocks.1.attn.W_O"], ((16, 1), (256, 1)), ()))
    return cases


def _sample(p, n):
    """A run of n consecutive weights from a random start (batched as in a scan of the whole parameter)."""
    g = torch.Generator().manual_seed(1)
    start = int(torch.randint(0, max(1, p.numel() - n), (1,), generator=g))
    mask = torch.zeros(p.numel(), dtype=torch.bool)
    mask[start:start + n] = True
    return mask.reshape(p.shape), list(range(start, start + n))


def generic_section(args) -> None:
    """The generic path against the naive loop, side by side in one process. Every round times each
    method on each case, the methods in a rotating order; figures are medians over rounds. Rates are
    marginal, (n - m) / (t(n weights) - t(m weights)) per parameter, so each method's one-time work
    (clean pass, trace and probe, the per-parameter check and clean-prefix pass) is left out, as in
    a scan of whole parameters; a case's row is a whole scan of its parameters derived from them
    (sum of size / rate). The first case times a whole scan, everything included."""
    import statistics
    from wtc.scan import generic as G
    methods = {"naive": None, "before": "vmap", "now": None}
    times, info = {}, {}                # (case, method, name, n) -> [seconds]; (case, name) -> (method, copies)

    def run(method, model, tokens, readout, name, n):
        p = dict(model.named_parameters())[name]
        mask, idx = (torch.ones_like(p, dtype=torch.bool), list(range(p.numel()))) if n is None else _sample(p, n)
        t = time.perf_counter()
        if method == "naive":
            naive_position_kl(model, tokens, name, readout, flat_indices=idx)
            return time.perf_counter() - t, None
        G.FORCE = methods[method]
        try:
            res = scan(model, tokens, params=[name], readout=readout or (lambda out: out), progress=False,
                       keep_positions=False, weights={name: mask})
        finally:
            G.FORCE = None
        seconds = time.perf_counter() - t
        made = G.LAST() if G.LAST is not None else None
        del res
        return seconds, (None if made is None else (made.method.get(name), made.copies_per_forward(name)))

    cases = generic_cases()
    for r in range(args.rounds):
        for c, (title, model, tokens, readout, params, sizes, whole) in enumerate(cases):
            order = list(methods)[r % 3:] + list(methods)[:r % 3]
            for method in order:
                for name in params:
                    plan = [None] if sizes is None or (method == "now" and name in whole) else \
                        list(sizes[0] if method == "naive" else sizes[1])
                    for n in plan:
                        dt, got = run(method, model, tokens, readout, name, n)
                        times.setdefault((c, method, name, n), []).append(dt)
                        if got is not None and method == "now" and n != 1:
                            info[(c, name)] = got
            print(f"round {r + 1}/{args.rounds}: {title}", flush=True)

    rows, detail = [], []
    for c, (title, model, tokens, readout, params, sizes, whole) in enumerate(cases):
        numel = {n: dict(model.named_parameters())[n].numel() for n in params}
        rate = {}                        # method -> name -> weights / s
        for method in methods:
            rate[method] = {}
            for name in params:
                if sizes is None or (method == "now" and name in whole):
                    sec = statistics.median(times[(c, method, name, None)])
                    rate[method][name] = numel[name] / sec
                else:
                    n, m = sizes[0] if method == "naive" else sizes[1]
                    sec = statistics.median(a - b for a, b in zip(times[(c, method, name, n)], times[(c, method, name, m)]))
                    rate[method][name] = (n - m) / max(sec, 1e-9)
        total = {method: sum(numel.values()) / sum(numel[n] / rate[method][n] for n in params) for method in methods}

        def how(name):
            method, copies = info.get((c, name), ("?", None))
            return f"{method}" + (f" x{copies}" if method == "rows" and copies else "")
        rows.append({"what": title, "naive_w_per_s": round(total["naive"], 2), "before_w_per_s": round(total["before"], 2),
                     "now_w_per_s": round(total["now"], 2), "before_vs_naive": round(total["before"] / total["naive"], 2),
                     "now_vs_naive": round(total["now"] / total["naive"], 2),
                     "now_vs_before": round(total["now"] / total["before"], 2),
                     "chosen": "; ".join(sorted({how(n) for n in params}))})
        for name in params:
            detail.append({"what": f"{title} :: {name}", "naive_w_per_s": round(rate["naive"][name], 2),
                           "before_w_per_s": round(rate["before"][name], 2), "now_w_per_s": round(rate["now"][name], 2),
                           "before_vs_naive": round(rate["before"][name] / rate["naive"][name], 2),
                           "now_vs_naive": round(rate["now"][name] / rate["naive"][name], 2),
                           "now_vs_before": round(rate["now"][name] / rate["before"][name], 2), "chosen": how(name)})
    for r in rows + detail:
        r.update({"date": stamp(), "machine": machine(), "threads": args.threads, "device": args.device,
                  "rounds": args.rounds})
    path = append_rows("ablation_generic", rows + detail)
    for table in (rows, detail):
        print("\n| generic path | naive w/s | before (vmap) w/s | now w/s | before / naive | now / naive | now / before | method now |")
        print("|---|---|---|---|---|---|---|---|")
        for r in table:
            print(f"| {r['what']} | {r['naive_w_per_s']} | {r['before_w_per_s']} | {r['now_w_per_s']} | "
                  f"{r['before_vs_naive']}x | {r['now_vs_naive']}x | {r['now_vs_before']}x | {r['chosen']} |")
    print(f"\n(appended to {path})")


if __name__ == "__main__":
    main()
