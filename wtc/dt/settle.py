"""Settling early: whether a population in training already holds an exact replica.

discover's attempts check from SETTLE_FROM, every SETTLE_EVERY steps, whether some
replica is right at every position of SETTLE_SEQUENCES fit sequences; the first such check ends the
training, and the finish (refit, snap, polish) starts from the model as it is then: the check
read the argmax model the finish freezes (a hard phase after it changed no solved count on ten
tasks, session 30). An attempt that does not settle runs its whole schedule: it may still be learning.

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
    settled). Snapping costs 0.1-0.5 s for SNAP_CHECK_REPLICAS replicas, so it runs at the checks of
    SNAP_CHECK_STEPS only (geometrically spaced: a task it cannot settle pays a few of them), on
    the replicas the head refit puts closest;
  or, at the checks of POLISH_CHECK_STEPS, with every replica snapped (a snap can make exact a
    replica the refit ranks last) and the SNAP_CHECK_REPLICAS closest then polished: their
    sub-MLPs and head, pointers pinned, by the finish's L-BFGS on POLISH_CHECK_SEQUENCES, up to
    POLISH_CHECK_ITERS iterations in chunks, stopped once one is exact or a chunk brings none
    closer. An output a sub-MLP computes is exact only once the sub-MLP is precise, which
    training alone reaches late or never (min_last2: polished, exact at step 400; as trained,
    never in 1300 steps); a product of two digits needs the polish on 1024 sequences, not 256
    (product_last2, step 400: 0.993 of positions right after 200 iterations on 256, all on 1024).
The check reads the model and draws no randomness: an attempt that has not settled is step for step
the attempt without checks.

Some real-valued targets are exact only as read: their sub-MLPs stall near 3e-3 relative error in
float32 (free_fall_height, nonlinear_combo: no check ever settled them, they ran all 1300 steps),
while symbolic regression reads the formula behind them and verification proves it. So a polished
check that finds no replica exact but one within CLOSE_FOR_READING tells the caller that a reading
may decide (Check.worth_reading; discover reads the finished population then, and trains on from
the check when no reading verifies: wtc.dt.attempt's read_close). Measured (seed 0, both first
rungs): free_fall_height within 0.011 at step 200 and read there; nonlinear_combo 0.74-0.80 at 200
(not read: a reading there failed) and 0.023-0.025 at 400, read there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wtc.tasks.limits import REAL_TOLERANCE
from wtc.dt.finish import least_squares_head, polish, refit_head
from wtc.dt.selection import EVAL
from wtc.dt.snap import snap_heads

SETTLE_FROM, SETTLE_EVERY, SETTLE_SEQUENCES = 100, 50, 512
SNAP_CHECK_REPLICAS = 2
SNAP_CHECK_STEPS = frozenset(int(SETTLE_FROM * f) << k for k in range(16) for f in (1, 1.5))   # 100, 150, 200, 300, 400, ...
POLISH_CHECK_STEPS = frozenset(2 * SETTLE_FROM << k for k in range(16))                         # 200, 400, 800, ...
POLISH_CHECK_ITERS, POLISH_CHECK_CHUNK, POLISH_CHECK_SEQUENCES = 200, 50, 1024
CLOSE_FOR_READING = 0.05   # real outputs: the polished check's largest relative error that is worth a reading


@dataclass(frozen=True)
class Check:
    """What a settle check found. how: how some replica is exact ("as trained", "head refit", "heads
    snapped", "sub-MLPs polished"), None when none is; closeness: the polished check's best quality
    (wtc.dt.settle.quality: minus the largest relative error for real outputs), None when it did
    not run."""

    how: str | None
    closeness: float | None = None

    def worth_reading(self, real: bool) -> bool:
        """No replica exact, but a real-valued one close enough that a reading may decide."""
        return real and self.how is None and self.closeness is not None and self.closeness >= -CLOSE_FOR_READING


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


def exact_by(model, fit_data, snap: bool, real: bool = False, polish_iters: int = 0) -> str | None:
    """How some replica of `model` is exact on the check's sequences of fit_data ((x, y, valid, y_raw),
    normalised as Attempt keeps them): "as trained", "head refit", "heads snapped" or "sub-MLPs
    polished"; None when none is. snap: whether the snapped check may run, polish_iters: the
    polished one after it (the caller's schedule; 0: not). real: the task's outputs are real
    numbers (exact: within REAL_TOLERANCE)."""
    return check(model, fit_data, snap, real, polish_iters).how


@torch.no_grad()
def check(model, fit_data, snap: bool, real: bool = False, polish_iters: int = 0) -> Check:
    """exact_by's check, with the polished check's closeness."""
    x, y, valid, y_raw = (t[:SETTLE_SEQUENCES] for t in fit_data)
    streams = []
    with model.hooks([("hook_stream", lambda stream, hook: streams.append(stream))]):
        pred, _ = model(x, EVAL)
    if _exact(quality(model, pred, y_raw, valid, real), real).any():
        return Check("as trained")
    h, body = len(x) // 2, streams[0][:, :, model.P:].double()   # (R, B, T, V)
    W, b, _ = least_squares_head(body[:, :h], y[:h], valid[:h])
    refit = (torch.einsum("rbtv,rvo->rbto", body[:, h:], W) + b[:, None, None]).float()
    refit_quality = quality(model, refit, y_raw[h:], valid[h:], real)
    if _exact(refit_quality, real).any():
        return Check("head refit")
    if not (snap or polish_iters):
        return Check(None)
    # the polished check snaps every replica: a snap can make exact a replica the refit ranks last
    # (relu_diff, step 200: max relative error 0.68 after the refit, 0 snapped)
    replicas = (range(model.R) if polish_iters and model.R > SNAP_CHECK_REPLICAS
                else np.argsort(-refit_quality, kind="stable")[:SNAP_CHECK_REPLICAS])
    return _finished_exact(model, [int(r) for r in replicas], fit_data, real, snap, polish_iters)


def _finished_exact(model, replicas: list[int], fit_data, real: bool, snap: bool, polish_iters: int) -> Check:
    """Whether one of `replicas`, finished as the finish would (frozen, its pointer heads snapped,
    its head refit; then its sub-MLPs polished) on the first half of the check's sequences, is
    exact on the second: "heads snapped" or "sub-MLPs polished", else None (Check.how; its
    closeness: the polished replicas' best, once the polish ran). The polish takes the
    SNAP_CHECK_REPLICAS closest after the snap, fit on POLISH_CHECK_SEQUENCES (the first half and
    sequences past the check's), in chunks of POLISH_CHECK_CHUNK iterations: it stops once one is
    exact, or after a chunk that does not bring the closest one closer. Works on a copy: the model
    in training is untouched."""
    x, y, valid, y_raw = (t[:SETTLE_SEQUENCES] for t in fit_data)
    h = len(x) // 2
    copy = model.select_replicas(replicas)
    copy.freeze()
    copy.eval()

    def closeness(fx, fy, fvalid) -> np.ndarray:
        refit_head(copy, fx, fy, fvalid)
        pred, _ = copy(x[h:], EVAL)
        return quality(copy, pred, y_raw[h:], valid[h:], real)

    snapped = None
    if snap and _has_pointer_heads(copy):
        snap_heads(copy, x[:h], y[:h], valid[:h])
        snapped = closeness(x[:h], y[:h], valid[:h])
        if _exact(snapped, real).any():
            return Check("heads snapped")
    if not polish_iters or not any(b.mlp is not None for b in copy.blocks):
        return Check(None)
    if copy.R > SNAP_CHECK_REPLICAS:
        ranked = closeness(x[:h], y[:h], valid[:h]) if snapped is None else snapped
        near = np.argsort(-ranked, kind="stable")[:SNAP_CHECK_REPLICAS]
        copy = copy.select_replicas([int(r) for r in near])
    more = POLISH_CHECK_SEQUENCES - h
    px, py, pvalid = (torch.cat([t[:h], t[SETTLE_SEQUENCES:SETTLE_SEQUENCES + more]]) for t in fit_data[:3])
    best = closeness(px, py, pvalid).max()
    for _ in range(0, polish_iters, POLISH_CHECK_CHUNK):
        with torch.enable_grad():            # exact_by runs without; the L-BFGS needs gradients
            polish(copy, px, py, pvalid, iters=POLISH_CHECK_CHUNK)
        now = closeness(px, py, pvalid)
        if _exact(now, real).any():
            return Check("sub-MLPs polished", float(now.max()))
        if now.max() <= best:
            return Check(None, float(best))
        best = now.max()
    return Check(None, float(best))
