"""The Assign-and-Add authors' released checkpoints (bexoo/assign-and-add) read into wtc.

Their files are TransformerLens HookedTransformer state dicts (`torch.load(..., weights_only=True)`):
2 layers, 1 head, d_model = d_head = 128, d_mlp = 512, ReLU, no normalisation, learned absolute
positions over 16 tokens, input vocabulary 74, output vocabulary 59 (numbers only), biases present
but zero, the layer-1 MLP zero. load_checkpoint() puts one into a wtc Transformer (bias=True, MLP in
block 1 only) with the same function: the 15 outputs their model does not have (tokens 59-73) get
a zero unembedding column and a logit bias of -1e4, so softmax and argmax over wtc's 74 outputs
equal theirs over 59 (exp(-1e4) is 0 in float32 and float64 alike).

evaluate() measures a model with this project's definitions (wtc.tasks.assign_add, the authors'
variant with their split, seed 42): the exhaustive 0-var held-out set, the exhaustive 2-var union
and its three categories, and the sampled pools.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch

from wtc.errors import CheckpointError, StudyError
from wtc.models import Transformer, TransformerConfig
from wtc.models.tl import from_tl_state_dict
from wtc.tasks.assign_add import ANSWER_POS, P, SEQ_LEN, UNION_CATEGORIES, VOCAB, AssignAdd

DEFAULT_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "assign_add_authors"
FINAL = "model_state_dict.pth"
_STEP = re.compile(r"checkpoint_step_(\d+)\.pth$")
NEG = -1e4          # logit bias of the outputs the authors' model lacks


def config() -> TransformerConfig:
    return TransformerConfig(n_layers=2, d_model=128, n_heads=1, d_head=128, d_mlp=512, d_vocab=VOCAB,
                             n_ctx=SEQ_LEN, act_fn="relu", normalization=None, mlp_layers=(1,), bias=True)


def checkpoints(directory=None) -> dict:
    """step -> path of the authors' checkpoints in `directory`, plus "final" for the final model."""
    d = Path(directory or DEFAULT_DIR)
    if not d.is_dir():
        raise StudyError(f"{d}: no directory of the authors' checkpoints")
    out: dict = {int(m.group(1)): p for p in d.iterdir() if (m := _STEP.fullmatch(p.name))}
    out = dict(sorted(out.items()))
    if (d / FINAL).exists():
        out["final"] = d / FINAL
    if not out:
        raise StudyError(f"{d}: holds no checkpoint_step_*.pth nor {FINAL}")
    return out


def load_checkpoint(path) -> Transformer:
    """A wtc Transformer computing the authors' model in `path` (float32, eval mode)."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:                     # noqa: BLE001 -- any unreadable file is a CheckpointError
        raise CheckpointError(f"{path}: not a readable torch state dict ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    cfg = config()
    w_u, b_u = state.get("unembed.W_U"), state.get("unembed.b_U")
    if w_u is None or b_u is None or tuple(w_u.shape) != (cfg.d_model, P) or tuple(b_u.shape) != (P,):
        raise CheckpointError(f"{path}: unembed.W_U / b_U are not ({cfg.d_model}, {P}) / ({P},), "
                              "not the authors' Assign-and-Add model")
    state = dict(state)
    state["unembed.W_U"] = torch.cat([w_u, torch.zeros(cfg.d_model, VOCAB - P, dtype=w_u.dtype)], 1)
    state["unembed.b_U"] = torch.cat([b_u, torch.full((VOCAB - P,), NEG, dtype=b_u.dtype)])
    try:
        model = from_tl_state_dict(state, cfg)
    except (ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: does not fit the authors' architecture: {str(exc).splitlines()[0]}") from None
    return model.float().eval()


def authors_task(**change) -> AssignAdd:
    """The authors' task (their split: seed 42, f 0.7; a, b never right, k, l never left)."""
    return AssignAdd(**{"variant": "authors", **change})


@torch.no_grad()
def predictions(model, tokens, chunk: int = 8192) -> np.ndarray:
    """Argmax over the numbers 0-58 at "=" for (n, 16) tokens."""
    tokens = torch.as_tensor(np.asarray(tokens))
    out = [model.logits_at(tokens[s:s + chunk], slice(ANSWER_POS, ANSWER_POS + 1))[:, 0, :P].argmax(-1)
           for s in range(0, len(tokens), chunk)]
    return torch.cat(out).numpy() if out else np.zeros(0, np.int64)


def exhaustive_accuracy(model, task: AssignAdd, union=None) -> dict:
    """acc_0var_heldout (each held-out pair once) and acc_2var_union_exhaustive with its categories;
    `union`: a precomputed task.exhaustive_2var_union()."""
    x0, y0 = task.pools(n=1)["0var_heldout"] if len(task.heldout_pairs) else (np.zeros((0, SEQ_LEN)), np.zeros(0))
    tokens, labels, cat = union if union is not None else task.exhaustive_2var_union()
    hit = predictions(model, tokens) == labels
    out = {"acc_0var_heldout": float((predictions(model, x0) == y0).mean()) if len(x0) else None,
           "acc_2var_union_exhaustive": float(hit.mean()), "union_n": int(len(labels))}
    for c, name in enumerate(UNION_CATEGORIES):
        sel = cat == c
        out[f"union_{name}"] = float(hit[sel].mean()) if sel.any() else None
        out[f"union_{name}_n"] = int(sel.sum())
    return out


def pool_accuracy(model, pools: dict) -> dict:
    return {k: float((predictions(model, x) == np.asarray(y)).mean()) for k, (x, y) in pools.items()}


@torch.no_grad()
def authors_init(model: Transformer, seed: int) -> None:
    """The authors' HookedTransformer at init: every weight matrix N(0, (0.8 / sqrt(d_model))^2), and
    59 outputs. The non-number outputs get zero weights and the fixed bias NEG: their softmax
    probability is exactly 0 in float32, so they get no gradient, weight decay keeps their zero
    weights at zero, and the model stays the authors' 59-way head throughout training."""
    g = torch.Generator().manual_seed(seed)
    std = 0.8 / math.sqrt(model.cfg.d_model)
    for _, p in model.named_parameters():        # weights only: the model has no trained biases
        p.normal_(0.0, std, generator=g)
    model.unembed.W_U[:, P:] = 0.0
    model.unembed.b_U[P:] = NEG


__all__ = ["DEFAULT_DIR", "checkpoints", "load_checkpoint", "authors_task", "predictions", "exhaustive_accuracy",
           "pool_accuracy", "config", "authors_init"]
