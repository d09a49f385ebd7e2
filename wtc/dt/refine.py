"""Pointer refinement: teach frozen pointer heads the keys that would have been best.

After annealing, a head's pointer is often right on most queries but wrong on near-ties (a
windowed max that misses when two values differ by 1): the squared error of such a miss is tiny,
so gradient descent in the soft phase barely sees it. With the structure frozen we can ask, for
every query, which keys would minimise the loss if this head pointed there (counterfactual
forwards with all pointers pinned and this head's pointer moved to each key in turn), then fit the
head's score parameters (W, u, rel, abs) to put its argmax inside that best set. A replica keeps
the refined head only if its hard model's loss drops.
"""
from __future__ import annotations

import time

import torch

from wtc.dt.selection import EVAL


def _per_query_loss(model, x, y, valid) -> torch.Tensor:
    pred, _ = model(x, EVAL)                                                   # (R, B, T, O)
    return ((pred - y).square() * valid).sum(-1)                              # (R, B, T)


def _inputs_of(model, attn, x):
    """The (stream, unit) tensors attention `attn` receives on inputs x."""
    captured = {}
    handle = attn.register_forward_pre_hook(lambda mod, args: captured.setdefault("args", args))
    try:
        with torch.no_grad():
            model(x, EVAL)
    finally:
        handle.remove()
    return captured["args"][0], captured["args"][1]


def best_keys(model, attn, h: int, x, y, valid, rel_tol: float = 1e-6):
    """(opt (R, B, T, L) bool: keys within tolerance of the best loss, informative (R, B, T) bool,
    suboptimal (R, B, T) bool: the current pointer is outside the best set)."""
    L = attn.P + attn.T
    with torch.no_grad(), model.pinned_pointers(x):
        base = attn.pinned.clone()                                             # (R, B, H, T)
        limit = torch.arange(attn.T, device=x.device) + attn.P                 # last visible key per query
        losses = []
        for j in range(L):
            moved = base.clone()
            moved[:, :, h] = torch.minimum(torch.full_like(base[:, :, h], j), limit)
            attn.pinned = moved
            losses.append(_per_query_loss(model, x, y, valid))
        attn.pinned = base
    loss = torch.stack(losses, dim=-1)                                         # (R, B, T, L)
    loss = loss.masked_fill(~attn.causal, float("inf"))
    best = loss.min(-1, keepdim=True).values
    opt = loss <= best + rel_tol * (1.0 + best)
    informative = ~opt.masked_fill(~attn.causal, True).all(-1)
    current = loss.gather(-1, base[:, :, h].unsqueeze(-1))
    suboptimal = (current > best + rel_tol * (1.0 + best)).squeeze(-1)
    return opt, informative, suboptimal


def refine_head(model, attn, h: int, x, y, valid, steps: int = 150, lr: float = 0.05) -> torch.Tensor:
    """Fit head h's score parameters to its best keys; returns the replicas that improved (R,) bool."""
    opt, informative, suboptimal = best_keys(model, attn, h, x, y, valid)
    if not bool(suboptimal.any()):
        return torch.zeros(model.R, dtype=torch.bool)
    params = [attn.W, attn.u, attn.rel, attn.abs, attn.log_scale]
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        before = _per_query_loss(model, x, y, valid).sum(dim=(1, 2))
    stream, unit = _inputs_of(model, attn, x)
    choice = attn.select(EVAL)
    weight = informative.float()
    optimizer = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        s = attn.scores(unit, choice)[:, :, h]                                 # (R, B, T, L)
        logp = torch.log_softmax(s, dim=-1)
        in_best = torch.logsumexp(logp.masked_fill(~opt, float("-inf")), dim=-1)   # log P(best set)
        loss = -(in_best * weight).sum(dim=(1, 2)) / weight.sum(dim=(1, 2)).clamp(min=1)
        optimizer.zero_grad()
        loss.sum().backward()
        # only head h moves: zero the other heads' gradients
        for p in params:
            keep = torch.zeros_like(p.grad)
            keep[:, h] = 1.0
            p.grad.mul_(keep)
        optimizer.step()
    with torch.no_grad():
        after = _per_query_loss(model, x, y, valid).sum(dim=(1, 2))
        improved = after < before
        for p, s in zip(params, saved):
            p[~improved] = s[~improved]
    return improved


def refine_pointers(model, x, y, valid, rounds: int = 2, steps: int = 150, until: float | None = None) -> int:
    """Refine every pointer head of a frozen model; returns how many (replica, head) fits improved.
    With until (a time.time()), no head starts after it (a head in flight finishes: it is one fit)."""
    count = 0
    for _ in range(rounds):
        changed = 0
        for block in model.blocks:
            attn = block.attn
            if attn is None or attn.H == 0:
                continue
            for h in range(attn.H):
                if until is not None and time.time() >= until:
                    return count + changed
                changed += int(refine_head(model, attn, h, x, y, valid, steps=steps).sum())
        count += changed
        if not changed:
            break
    return count
