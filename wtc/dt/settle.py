"""Settling early: whether a population in training already holds an exact replica.

discover's attempts (integer tasks) check from SETTLE_FROM, every SETTLE_EVERY steps, whether some
replica is right at every position of SETTLE_SEQUENCES fit sequences; the first such check ends the
annealing. A settled attempt's hard phase ends at the first such check from HARD_SETTLED_MIN hard
steps on (its pointers crisp, its sub-MLPs precise under them; the finish's refit, snap and polish
do the rest); an attempt that does not settle runs its whole schedule: it may still be learning.

A replica counts as exact when, on the check's sequences, its argmax model is right
  as trained;
  with a least-squares head fit to half of them and checked on the other half (the finish refits
    the head anyway: a sum's or a delay's trained head was the last thing to settle, measured);
  or with its pointer heads snapped to the routing rules they nearly follow (wtc.dt.snap, what the
    finish does) and the head refit, checked the same way. A windowed maximum's content head
    follows its rule on most queries long before training makes it exact on all of them
    (max_last3: the snapped check was exact at step 100 of 1300; without it the attempt never
    settled). Snapping costs 0.1-0.6 s for SNAP_CHECK_REPLICAS replicas, so it runs at the checks of
    SNAP_CHECK_STEPS only (geometrically spaced: a task it cannot settle pays a few of them) and in
    a settled attempt's hard phase, on the replicas the head refit puts closest.
The check reads the model and draws no randomness: an attempt that has not settled is step for step
the attempt without checks.
"""
from __future__ import annotations

import numpy as np
import torch

from wtc.dt.finish import least_squares_head, refit_head
from wtc.dt.selection import EVAL
from wtc.dt.snap import snap_heads

SETTLE_FROM, SETTLE_EVERY, SETTLE_SEQUENCES, HARD_SETTLED_MIN = 100, 50, 512, 100
SNAP_CHECK_REPLICAS = 2
SNAP_CHECK_STEPS = frozenset(int(SETTLE_FROM * f) << k for k in range(16) for f in (1, 1.5))   # 100, 150, 200, 300, 400, ...


def _right(model, pred: torch.Tensor, y_raw: torch.Tensor, valid: torch.Tensor) -> np.ndarray:
    """Per replica (R,): whether the rounded prediction is the target at every valid position."""
    hit = (torch.round(model.denormalize_outputs(pred)) == torch.nan_to_num(y_raw)).float() * valid
    return (hit.sum(dim=(1, 2, 3)) >= valid.sum()).cpu().numpy()


def _has_pointer_heads(model) -> bool:
    return any(b.attn is not None and b.attn.H for b in model.blocks)


@torch.no_grad()
def exact_by(model, fit_data, snap: bool) -> str | None:
    """How some replica of `model` is exact on the check's sequences of fit_data ((x, y, valid, y_raw),
    normalised as Attempt keeps them): "as trained", "head refit" or "heads snapped"; None when
    none is. snap: whether the snapped check may run (the caller's schedule)."""
    x, y, valid, y_raw = (t[:SETTLE_SEQUENCES] for t in fit_data)
    streams = []
    with model.hooks([("hook_stream", lambda stream, hook: streams.append(stream))]):
        pred, _ = model(x, EVAL)
    if _right(model, pred, y_raw, valid).any():
        return "as trained"
    h, body = len(x) // 2, streams[0][:, :, model.P:].double()   # (R, B, T, V)
    W, b, _ = least_squares_head(body[:, :h], y[:h], valid[:h])
    refit = (torch.einsum("rbtv,rvo->rbto", body[:, h:], W) + b[:, None, None]).float()
    if _right(model, refit, y_raw[h:], valid[h:]).any():
        return "head refit"
    if not snap or not _has_pointer_heads(model):
        return None
    hit = (torch.round(model.denormalize_outputs(refit)) == torch.nan_to_num(y_raw[h:])).float() * valid[h:]
    closest = np.argsort(-hit.sum(dim=(1, 2, 3)).cpu().numpy(), kind="stable")[:SNAP_CHECK_REPLICAS]
    if _snapped_right(model, [int(r) for r in closest], x, y, valid, y_raw):
        return "heads snapped"
    return None


def _snapped_right(model, replicas: list[int], x, y, valid, y_raw) -> bool:
    """Whether one of `replicas`, frozen, its pointer heads snapped and its head refit on the first
    half of the sequences (a copy: the model in training is untouched), is right on the second."""
    h = len(x) // 2
    copy = model.select_replicas(replicas)
    copy.freeze()
    copy.eval()
    snap_heads(copy, x[:h], y[:h], valid[:h])
    refit_head(copy, x[:h], y[:h], valid[:h])
    pred, _ = copy(x[h:], EVAL)
    return bool(_right(copy, pred, y_raw[h:], valid[h:]).any())
