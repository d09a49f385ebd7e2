"""Settling early: whether a population in training already holds an exact replica.

discover's attempts check from SETTLE_FROM, every SETTLE_EVERY steps, whether some
replica is right at every position of SETTLE_SEQUENCES fit sequences; the first such check ends the
annealing. A settled attempt's hard phase ends at the first such check from HARD_SETTLED_MIN hard
steps on (its pointers crisp, its sub-MLPs precise under them; the finish's refit, snap and polish
do the rest); an attempt that does not settle runs its whole schedule: it may still be learning.

A replica counts as exact when, on the check's sequences, its argmax model is right (an integer
task: every rounded output the target; a real one: every relative error within the task's solved
criterion, REAL_TOLERANCE; a linear recurrence's or a weighted sum's head refit meets it from step
100, where it used to anneal for all 1000 steps)
  as trained;
  with a least-squares head fit to half of them and checked on the other half (the finish refits
    the head anyway: a sum's or a delay's trained head was the last thing to settle, measured);
  or with its pointer heads snapped to the routing rules they nearly follow (wtc.dt.snap, what the
    finish does) and the head refit, checked the same way. A windowed maximum's content head
    follows its rule on most queries long before training makes it exact on all of them
    (max_last3: the snapped check was exact at step 100 of 1300; without it the attempt never
    settled). Snapping costs 0.1-0.6 s for SNAP_CHECK_REPLICAS replicas, so it runs at the checks of
    SNAP_CHECK_STEPS only (geometrically spaced: a task it cannot settle pays a few of them) and in
    a settled attempt's hard phase, on the replicas the head refit puts closest;
  or, at the checks of POLISH_CHECK_STEPS, with those replicas' sub-MLPs and head then polished
    (POLISH_CHECK_ITERS of the finish's L-BFGS, pointers pinned). An output a sub-MLP computes is
    exact only once the sub-MLP is precise, which training alone reaches late or never (min_last2:
    polished, exact at step 400; as trained, never in 1300 steps; products, thresholds and free
    fall's square were not settled by it either, session 28). 0.5-1 s a check, three times in a
    schedule.
The check reads the model and draws no randomness: an attempt that has not settled is step for step
the attempt without checks.
"""
from __future__ import annotations

import numpy as np
import torch

from wtc.tasks.limits import REAL_TOLERANCE
from wtc.dt.finish import least_squares_head, polish, refit_head
from wtc.dt.selection import EVAL
from wtc.dt.snap import snap_heads

SETTLE_FROM, SETTLE_EVERY, SETTLE_SEQUENCES, HARD_SETTLED_MIN = 100, 50, 512, 50
SNAP_CHECK_REPLICAS = 2
SNAP_CHECK_STEPS = frozenset(int(SETTLE_FROM * f) << k for k in range(16) for f in (1, 1.5))   # 100, 150, 200, 300, 400, ...
POLISH_CHECK_STEPS = frozenset(2 * SETTLE_FROM << k for k in range(16))                         # 200, 400, 800, ...
POLISH_CHECK_ITERS = 100


def quality(model, pred: torch.Tensor, y_raw: torch.Tensor, valid: torch.Tensor, real: bool) -> np.ndarray:
    """Per replica (R,), higher is better: the share of valid positions whose rounded prediction is
    the target (integer outputs), or minus the largest relative error |p - y| / (1 + |y|) (real; NaN
    where a prediction is NaN, never exact). Attempt's batch metric is this, the error's sign flipped."""
    p, y = model.denormalize_outputs(pred), torch.nan_to_num(y_raw)
    if not real:
        hit = (torch.round(p) == y).float() * valid
        return (hit.sum(dim=(1, 2, 3)) / valid.sum()).cpu().numpy()
    rel = (p - y).abs() / (1 + y.abs()) * valid
    return -rel.amax(dim=(1, 2, 3)).cpu().numpy()


def _exact(quality: np.ndarray, real: bool) -> np.ndarray:
    return quality >= -REAL_TOLERANCE if real else quality >= 1.0


def _has_pointer_heads(model) -> bool:
    return any(b.attn is not None and b.attn.H for b in model.blocks)


@torch.no_grad()
def exact_by(model, fit_data, snap: bool, real: bool = False, polish_iters: int = 0) -> str | None:
    """How some replica of `model` is exact on the check's sequences of fit_data ((x, y, valid, y_raw),
    normalised as Attempt keeps them): "as trained", "head refit", "heads snapped" or "sub-MLPs
    polished"; None when none is. snap: whether the snapped check may run, polish_iters: the
    polished one after it (the caller's schedule; 0: not). real: the task's outputs are real
    numbers (exact: within REAL_TOLERANCE)."""
    x, y, valid, y_raw = (t[:SETTLE_SEQUENCES] for t in fit_data)
    streams = []
    with model.hooks([("hook_stream", lambda stream, hook: streams.append(stream))]):
        pred, _ = model(x, EVAL)
    if _exact(quality(model, pred, y_raw, valid, real), real).any():
        return "as trained"
    h, body = len(x) // 2, streams[0][:, :, model.P:].double()   # (R, B, T, V)
    W, b, _ = least_squares_head(body[:, :h], y[:h], valid[:h])
    refit = (torch.einsum("rbtv,rvo->rbto", body[:, h:], W) + b[:, None, None]).float()
    refit_quality = quality(model, refit, y_raw[h:], valid[h:], real)
    if _exact(refit_quality, real).any():
        return "head refit"
    if not (snap or polish_iters):
        return None
    closest = np.argsort(-refit_quality, kind="stable")[:SNAP_CHECK_REPLICAS]
    return _finished_exact(model, [int(r) for r in closest], x, y, valid, y_raw, real, snap, polish_iters)


def _finished_exact(model, replicas: list[int], x, y, valid, y_raw, real: bool, snap: bool,
                    polish_iters: int) -> str | None:
    """Whether one of `replicas`, finished as the finish would (frozen, its pointer heads snapped,
    its head refit; then its sub-MLPs polished) on the first half of the sequences, is exact on the
    second: "heads snapped" or "sub-MLPs polished", else None. Works on a copy: the model in
    training is untouched."""
    h = len(x) // 2
    copy = model.select_replicas(replicas)
    copy.freeze()
    copy.eval()

    def exact_now() -> bool:
        refit_head(copy, x[:h], y[:h], valid[:h])
        pred, _ = copy(x[h:], EVAL)
        return bool(_exact(quality(copy, pred, y_raw[h:], valid[h:], real), real).any())

    if snap and _has_pointer_heads(copy):
        snap_heads(copy, x[:h], y[:h], valid[:h])
        if exact_now():
            return "heads snapped"
    if polish_iters and any(b.mlp is not None for b in copy.blocks):
        refit_head(copy, x[:h], y[:h], valid[:h])
        with torch.enable_grad():            # exact_by runs without; the L-BFGS needs gradients
            polish(copy, x[:h], y[:h], valid[:h], iters=polish_iters)
        if exact_now():
            return "sub-MLPs polished"
    return None
