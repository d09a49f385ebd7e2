"""Periodic aggregates' coefficients set to the integers they nearly are, after training (used by
wtc.dt.attempt's finish, before the polish): a sub-MLP's periodic units read a weighted sum exactly
only when its weights are integers (wtc.dt.periodic), and the program's line is then exact.
(Sub-MLP outputs that a sum head adds up: wtc.dt.step_snap.)"""
from __future__ import annotations

import time

import torch

from wtc.dt.finish import masked_mse, polish, refit_head
from wtc.dt.selection import EVAL

SNAP_DISTANCE = 0.15     # coefficients this close to integers are tried as integers
SNAP_SLACK = 1.05        # ... and kept when the loss after a short polish is below this x before
SNAP_POLISH = 50         # L-BFGS iterations of the snapped replicas' sub-MLPs


def snap_coefficients(model, x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
                      until: float | None = None) -> list[dict]:
    """Replicas whose periodic coefficients lie within SNAP_DISTANCE of integers (and are not
    integers already) get those integers, then the exact head refit and SNAP_POLISH L-BFGS
    iterations of their sub-MLPs (which were tuned to the inexact sums); kept when the replica's
    loss is then within SNAP_SLACK of before. Returns what was set: [{replica, head, before, after,
    loss_before, loss_after}]. With until (a time.time()) nothing starts after it and the polish
    stops there."""
    def periodic_of(m):
        return [(layer, b.attn.periodic) for layer, b in enumerate(m.blocks)
                if b.attn is not None and b.attn.periodic is not None]

    if not periodic_of(model) or (until is not None and time.time() >= until):
        return []
    with torch.no_grad():
        near = torch.zeros(model.R, dtype=torch.bool)
        for _, m in periodic_of(model):
            off = (m.coef - m.coef.round()).abs()
            near |= ((off <= SNAP_DISTANCE).all(dim=2) & (off > 0).any(dim=2)).any(dim=1).cpu()
        if not near.any():
            return []
        before = refit_head(model, x, y, valid).cpu()
        idx = near.nonzero().ravel().tolist()
        sub = model.select_replicas(idx)
        olds = [m.coef.clone() for _, m in periodic_of(sub)]
        for _, m in periodic_of(sub):
            off = (m.coef - m.coef.round()).abs()
            close = (off <= SNAP_DISTANCE).all(dim=2, keepdim=True)
            m.set_coef(torch.where(close, m.coef.round(), m.coef))
        refit_head(sub, x, y, valid)
    polish(sub, x, y, valid, iters=SNAP_POLISH, until=until)
    with torch.no_grad():
        after = masked_mse(sub(x, EVAL)[0], y, valid).cpu()
    keep = [k for k, r in enumerate(idx) if after[k] <= SNAP_SLACK * before[r] + 1e-12]
    out = []
    for k in keep:
        for (layer, m), old in zip(periodic_of(sub), olds):
            for i, a in enumerate(m.heads):
                if not torch.equal(old[k, i], m.coef.detach()[k, i]):
                    out.append({"replica": idx[k], "head": f"L{layer}.a{a}",
                                "before": [round(float(v), 4) for v in old[k, i, :m.periods[i]]],
                                "after": [int(round(float(v))) for v in m.coef.detach()[k, i, :m.periods[i]]],
                                "loss_before": float(before[idx[k]]), "loss_after": float(after[k])})
    if keep:
        model.assign_replicas([idx[k] for k in keep], sub.select_replicas(keep))
    return out

