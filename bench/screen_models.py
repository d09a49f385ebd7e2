"""The two models bench/screen.py compares the screen against the exact scan on, built the same way
every time (seeded), trained briefly on a Markov stream so their weights are not random, and
saved under runs/screen_bench/ so the exact scans (long) and the screens (short) see the same
weights across processes and resumes (runs/screen_bench/, not committed: the exact stores are
large; bench/screen.py writes its figures to bench/results/screen.csv).

    wtc   wtc Transformer (the kind bench/ablation.py scans), 2 layers, d_model 32, 4 heads, d_mlp 128, vocab 64
    gpt2  transformers GPT2LMHeadModel from a GPT2Config (tied wte), same sizes

Both read 8 sequences of 32 tokens (256 positions): small enough that the exact scan of every
matrix weight (~28k each) fits in minutes on 2 loaded cores (d_model 64 over 1024 positions ran
at 9 weights/s on GPT-2's first layers: hours), trained enough (loss well below log V) that KLs
spread over orders of magnitude as in a real model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from wtc.models.lm import MarkovSource, next_token_loss, train_lm
from wtc.models.training import TrainConfig, train

HERE = Path(__file__).resolve().parent.parent / "runs" / "screen_bench"
VOCAB, CTX, D, LAYERS, HEADS = 64, 32, 32, 2, 4
SEQUENCES = 8
STEPS = 400


def source() -> MarkovSource:
    return MarkovSource(VOCAB, CTX, seed=0)


def scan_tokens() -> torch.Tensor:
    return source().sample(np.random.default_rng([0, 1]), SEQUENCES)


def wtc_model() -> torch.nn.Module:
    from wtc.models import Transformer, TransformerConfig
    from wtc.models.io import load, save

    path = HERE / "wtc_model"
    if path.exists():
        return load(path).eval()
    cfg = TransformerConfig(n_layers=LAYERS, d_model=D, n_heads=HEADS, d_head=D // HEADS, d_mlp=4 * D,
                            d_vocab=VOCAB, n_ctx=CTX)
    model = Transformer(cfg, seed=0)
    losses = train_lm(model, source(), STEPS, batch=32, lr=3e-3, seed=0, progress=False)
    print(f"wtc model: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {STEPS} steps", flush=True)
    save(model, path, extra={"steps": STEPS, "final_loss": losses[-1]})
    return model.eval()


def gpt2_config(d=D, layers=LAYERS, heads=HEADS, vocab=VOCAB, ctx=CTX):
    from transformers import GPT2Config
    return GPT2Config(n_embd=d, n_layer=layers, n_head=heads, vocab_size=vocab, n_positions=ctx,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")


class _Logits(torch.nn.Module):
    """GPT2LMHeadModel returning its logits tensor (what wtc.models.lm.next_token_loss reads)."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, tokens):
        return self.hf(tokens).logits


def gpt2_model() -> torch.nn.Module:
    from transformers import GPT2LMHeadModel

    path = HERE / "gpt2_model.pt"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(gpt2_config())
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    rng = np.random.default_rng(0)
    src = source()
    wrapped = _Logits(model)
    result = train(wrapped, TrainConfig(steps=STEPS, lr=3e-3, weight_decay=0.01), lambda step: src.sample(rng, 32),
                   lambda tokens: next_token_loss(wrapped, tokens), progress=False, checkpoint_seconds=None)
    print(f"gpt2 model: loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f} in {STEPS} steps", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model.eval()


def gpt2_readout(out):
    return out.logits


MODELS = {"wtc": (wtc_model, None), "gpt2": (gpt2_model, gpt2_readout)}


def exact(which: str, progress: bool = True, device: str = "cpu", out: Path | None = None, params=None):
    """The exact scan of every matrix of `which` (resumable: runs/screen_bench/exact_<which>/)."""
    from wtc.scan import scan
    build, readout = MODELS[which]
    model = build().to(device)
    out = HERE / f"exact_{which}" if out is None else out
    return scan(model, scan_tokens().to(device), params=params, readout=readout, out=out, keep_positions=False,
                progress=progress)


def exact_npz(which: str) -> Path:
    """Where the exact totals of `which` are kept as {parameter name: float64 array} (bench/screen.py reads them)."""
    return HERE / f"exact_{which}.npz"


def save_totals(result, path: Path) -> None:
    np.savez(path, **{n: t.numpy() for n, t in result.total_kl.items()})


if __name__ == "__main__":
    # python -m bench.screen_models [--device cuda] [--npz DIR] wtc gpt2: the exact scans, resumable
    # (on a GPU: in a store under --npz DIR, the totals written there as exact_<which>.npz)
    import argparse
    import time
    ap = argparse.ArgumentParser()
    ap.add_argument("which", nargs="+", choices=sorted(MODELS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--npz", default=None, help="directory for exact_<which>.npz (default runs/screen_bench)")
    ap.add_argument("--params", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1 if args.device == "cpu" else 8)
    if args.device == "cuda":             # exact float32 products: no TF32 rounding in the exact KL
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    for which in args.which:
        t = time.perf_counter()
        where = Path(args.npz) if args.npz else HERE
        res = exact(which, device=args.device, out=where / f"exact_{which}",
                    params=args.params.split(",") if args.params else None)
        save_totals(res, where / f"exact_{which}.npz")
        print(which, f"{time.perf_counter() - t:.1f} s", res.summary(), flush=True)
