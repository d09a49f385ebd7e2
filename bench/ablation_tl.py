"""A TransformerLens HookedTransformer scanned through its wtc twin vs the generic path, one run.

Same shape as bench/ablation.py (2 layers, d_model 128, 4 heads, d_mlp 512, vocab 512, 64 x 128
tokens) but a HookedTransformer (LN, GELU). "generic" = scan with an identity readout (which keeps
the model as it is: vmap over parameter copies, from the cached residual stream where it can);
"twin" = scan(hooked) as a user calls it (the wtc Transformer with the same weights, the structured
path). 64 consecutive weights per parameter, rates including each scan's one-time clean pass.
Needs TransformerLens (pip install -c constraints.txt -e ".[tl]").

    python -m bench.ablation_tl [--threads 2]
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch

from bench.common import append_rows, machine, stamp
from wtc.scan import scan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import transformer_lens as tl
    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=128, n_ctx=128, d_head=32, n_heads=4, d_mlp=512,
                                     d_vocab=512, act_fn="gelu", normalization_type="LN", seed=0)
    model = tl.HookedTransformer(cfg).eval()
    tokens = torch.randint(0, 512, (64, 128), generator=torch.Generator().manual_seed(0))
    rows = []
    for name in ["blocks.0.attn.W_Q", "blocks.0.mlp.W_in", "blocks.1.attn.W_O", "blocks.1.mlp.W_out"]:
        p = dict(model.named_parameters())[name]
        mask = torch.zeros(p.shape, dtype=torch.bool)
        mask.view(-1)[1000:1064] = True
        rates, totals = {}, {}
        for label, readout in (("generic", lambda out: out), ("twin", None)):
            t = time.perf_counter()
            res = scan(model, tokens, params=name, weights={name: mask}, readout=readout, progress=False,
                       keep_positions=False)
            rates[label] = res.weights_scanned / (time.perf_counter() - t)
            totals[label] = res.total_kl[name].view(-1)[1000:1064]
        diff = float(((totals["twin"] - totals["generic"]).abs() / totals["generic"].abs().clamp_min(1e-12)).max())
        rows.append({"what": f"HookedTransformer {name} (max rel diff of totals {diff:.1e})",
                     "naive_w_per_s": round(rates["generic"], 2), "fast_w_per_s": round(rates["twin"], 2),
                     "speedup": round(rates["twin"] / rates["generic"], 2)})
        print(rows[-1], flush=True)
    for r in rows:
        r.update({"date": stamp(), "machine": machine(), "threads": args.threads, "device": "cpu"})
    path = append_rows("ablation_tl", rows)
    print("\n| what | generic w/s | twin w/s | ratio |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} | {r['naive_w_per_s']} | {r['fast_w_per_s']} | {r['speedup']}x |")
    print(f"\n(appended to {path})")


if __name__ == "__main__":
    main()
