"""Summed steps set to the levels they nearly take, after training (used by wtc.dt.attempt's finish,
after the polish, which brings them closest). A sub-MLP output that a later sum head adds up is the
step of a running count or sum. Where the step lies within STEP_DISTANCE of whole numbers on every
input, it is rounded to them: a later layer's periodic units read the running sum's residue exactly
only of whole numbers (the parity of a dot product: a step of 0.968 reads right on short runs and
wrong once 16 positions have counted). Where it takes a few evenly spaced levels instead, it is
replaced by the level's index: the count of even digits is then the sum of `1 - x % 2`, not of a
two-valued curve the regression follows to its 0.003 wobble (Evens_Counter read as
`3223/1000 sin(cos(127/40 x - 3/20)) + 783/1000`). Either way SubMLPs.whole holds it from then on:
round((output - level_origin) / level_size), which passes no gradient, so later polishes leave it."""
from __future__ import annotations

import time

import torch

from wtc.dt.finish import masked_mse, polish, refit_head
from wtc.dt.selection import EVAL

STEP_DISTANCE = 0.1      # largest distance of a step's (scaled) values from whole numbers that is rounded
MAX_LEVELS = 5           # evenly spaced levels a step may take, lowest to highest
STEP_SLACK = 1.05        # kept when the loss after the head refit and a short polish is below this x before
STEP_POLISH = 50         # L-BFGS iterations of the snapped replicas' sub-MLPs


def summed_steps(model) -> dict[int, list[tuple[int, int]]]:
    """{replica: [(block, sub-MLP)]}: the sub-MLP outputs a later sum head adds up."""
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


def levels_of(values: torch.Tensor) -> tuple[float, float] | None:
    """(origin, size) such that (values - origin) / size lie within STEP_DISTANCE of whole numbers
    and are not those numbers already: (0, 1) where the values lie near whole numbers, else the
    fewest evenly spaced levels (up to MAX_LEVELS) from their least to their greatest; None."""
    def off(u):
        return float((u - u.round()).abs().max())

    near = off(values)
    if near <= STEP_DISTANCE:
        return (0.0, 1.0) if near > 0 else None
    lo, span = float(values.min()), float(values.max() - values.min())
    if not span > 1e-6 * (1.0 + abs(lo)):            # a constant: no step to count
        return None
    for k in range(1, MAX_LEVELS):
        if off((values - lo) / span * k) <= STEP_DISTANCE:
            return lo, span / k
    return None


def snap_steps(model, x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
               until: float | None = None) -> list[dict]:
    """Replicas of a frozen model where a summed sub-MLP output (summed_steps) takes levels
    (levels_of) on inputs x get it set to the level's index (SubMLPs.whole), then the exact head
    refit and STEP_POLISH L-BFGS iterations of the sub-MLPs; kept when the replica's loss is then
    within STEP_SLACK of before. Returns what was set: [{replica, mlp, origin, size, values,
    loss_before, loss_after}]. With until (a time.time()) nothing starts after it and the polish
    stops there."""
    steps = summed_steps(model)
    if not steps or (until is not None and time.time() >= until):
        return []
    hook = "blocks.{}.mlp.hook_post"
    blocks = sorted({i for pairs in steps.values() for i, _ in pairs})
    with torch.no_grad(), model.caching([hook.format(i) for i in blocks]) as cache:
        before = masked_mse(model(x, EVAL)[0], y, valid).cpu()
    chosen: dict[int, list[tuple[int, int, tuple[float, float]]]] = {}
    for r, pairs in steps.items():
        for i, m in pairs:
            levels = levels_of(cache[hook.format(i)][r, ..., m])
            if levels is not None:
                chosen.setdefault(r, []).append((i, m, levels))
    if not chosen:
        return []
    idx = sorted(chosen)
    sub = model.select_replicas(idx)
    with torch.no_grad():
        for k, r in enumerate(idx):
            for i, m, (origin, size) in chosen[r]:
                mlp = sub.blocks[i].mlp
                mlp.whole[k, m], mlp.level_origin[k, m], mlp.level_size[k, m] = True, origin, size
    refit_head(sub, x, y, valid)
    polish(sub, x, y, valid, iters=STEP_POLISH, until=until)
    with torch.no_grad(), sub.caching([hook.format(i) for i in blocks]) as snapped:
        after = masked_mse(sub(x, EVAL)[0], y, valid).cpu()
    out, keep = [], []
    for k, r in enumerate(idx):
        if after[k] <= STEP_SLACK * before[r] + 1e-12:
            keep.append(k)
            for i, m, (origin, size) in chosen[r]:
                values = snapped[hook.format(i)][k, ..., m].unique().tolist()
                out.append({"replica": r, "mlp": f"L{i}.m{m}", "origin": origin, "size": size,
                            "values": [int(v) for v in values[:16]],
                            "loss_before": float(before[r]), "loss_after": float(after[k])})
    if keep:
        model.assign_replicas([idx[k] for k in keep], sub.select_replicas(keep))
    return out
