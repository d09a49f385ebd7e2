"""What a sub-MLP's periodic units read, set to the integers it nearly is, after training (used by
wtc.dt.attempt's finish, before the polish). The units read a residue exactly only of a whole
number: of a periodic aggregate's weighted sum when its weights are integers (wtc.dt.periodic,
snap_coefficients), and of a sum head's running sum of a sub-MLP's output when that output is whole
on every input (snap_steps: the parity of a dot product counts the positions where both bits are
1; a step of 0.968 reads right on short runs and wrong after 16 of them)."""
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


STEP_DISTANCE = 0.1      # summed sub-MLP outputs this close to whole numbers on every input are rounded


def summed_steps(model) -> dict[int, list[tuple[int, int]]]:
    """{replica: [(block, sub-MLP)]}: the sub-MLP outputs a later sum head adds up, in a model
    whose sub-MLPs have periodic units (what they read of the running sum is its residue)."""
    if not model.config.mlp_periods:
        return {}
    names = model.variable_names
    made_by = {names.index(n): (i, m) for i, b in enumerate(model.blocks) if b.mlp is not None
               for m, n in enumerate(b.mlp.names)}
    found: dict[int, list[tuple[int, int]]] = {}
    for b in model.blocks:
        a = b.attn
        if a is None or not a.A:
            continue
        sources = a.select.index()[:, 3 * a.H:].tolist()        # (R, A): what the aggregates read
        for r, row in enumerate(sources):
            for op, v in zip(a.agg_ops, row):
                if op == "sum" and v in made_by and made_by[v] not in found.get(r, []):
                    found.setdefault(r, []).append(made_by[v])
    return found


def snap_steps(model, x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
               until: float | None = None) -> list[dict]:
    """Replicas of a frozen model where a summed sub-MLP output (summed_steps) lies within
    STEP_DISTANCE of whole numbers on inputs x, and is not whole already, get it rounded from now
    on (SubMLPs.whole), then the exact head refit and SNAP_POLISH L-BFGS iterations of the sub-MLPs
    (the rounded one no longer moves: the rounding passes no gradient); kept when the replica's
    loss is then within SNAP_SLACK of before. Returns what was set: [{replica, mlp, values,
    loss_before, loss_after}]. With until (a time.time()) nothing starts after it and the polish
    stops there."""
    steps = summed_steps(model)
    if not steps or (until is not None and time.time() >= until):
        return []
    hook = "blocks.{}.mlp.hook_post"
    blocks = sorted({i for pairs in steps.values() for i, _ in pairs})
    with torch.no_grad(), model.caching([hook.format(i) for i in blocks]) as cache:
        model(x, EVAL)
    chosen: dict[int, list[tuple[int, int]]] = {}
    for r, pairs in steps.items():
        for i, m in pairs:
            out = cache[hook.format(i)][r, ..., m]
            if 0 < (out - out.round()).abs().max() <= STEP_DISTANCE:
                chosen.setdefault(r, []).append((i, m))
    if not chosen:
        return []
    with torch.no_grad():
        before = refit_head(model, x, y, valid).cpu()
    idx = sorted(chosen)
    sub = model.select_replicas(idx)
    with torch.no_grad():
        for k, r in enumerate(idx):
            for i, m in chosen[r]:
                sub.blocks[i].mlp.whole[k, m] = True
    refit_head(sub, x, y, valid)
    polish(sub, x, y, valid, iters=SNAP_POLISH, until=until)
    with torch.no_grad(), sub.caching([hook.format(i) for i in blocks]) as rounded:
        after = masked_mse(sub(x, EVAL)[0], y, valid).cpu()
    out, keep = [], []
    for k, r in enumerate(idx):
        if after[k] <= SNAP_SLACK * before[r] + 1e-12:
            keep.append(k)
            for i, m in chosen[r]:
                values = rounded[hook.format(i)][k, ..., m].unique().tolist()
                out.append({"replica": r, "mlp": f"L{i}.m{m}", "values": [int(v) for v in values[:16]],
                            "loss_before": float(before[r]), "loss_after": float(after[k])})
    if keep:
        model.assign_replicas([idx[k] for k in keep], sub.select_replicas(keep))
    return out
