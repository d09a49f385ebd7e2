"""Snapping: a pointer head set to the routing rule it nearly follows, kept when the loss falls.

After annealing, a content head that learned a prefix or windowed maximum as a softmax over its
keys' scores is often right on most queries but not all: its key score must be strictly monotone
in the key's value with every step between two values larger than the spread of its positional
terms, and the gradient asks for that precision only through the few queries where it misses
(running_max: best rule agreement 0.86; max_last7 heads 0.34-0.55). Training cannot see the exact
rule; a hypothesis test can. For each replica and pointer head of the frozen model, the routing
rules of wtc.extraction.routing_rules that agree best with what the head routes on training data
are written into the head's score parameters exactly (`realise`):

  offset d        a one-hot positional score at offset d (pads or the query itself before t = d)
  absolute p      a one-hot score at key position p
  window max/min  a key score strictly monotone in the key variable (u constant over the PLE bins:
                  u . PLE(z) = c N z), a positional mask over the window, pads masked unless the
                  rule includes them, and a tilt of one unit per position for its ties
  latest where    a key score two-levelled in the key variable (u solved so that u . PLE(z) is
                  B on the predicate's values, 0 elsewhere), the recency ramp -RECENCY_SLOPE * d,
                  the query's own position excluded (strict) or not, and the pads above the keys
                  outside the predicate ("none: a pad"); the only rule a recency head is snapped to

the realised head is checked to route exactly what the rule routes, and of the candidates that
lower the replica's training loss after the exact head refit (by SNAP_GAIN) the lowest is kept. The model then
computes the rule itself, so extraction reads it at agreement 1.0 and verification on fresh data
decides, as for every program. Skipped when some replica already fits exactly (EXACT_FIT): the
population has its answer.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import time

import numpy as np
import torch

from wtc.dt.finish import EXACT_FIT, refit_head
from wtc.dt.refine import _inputs_of
from wtc.dt.selection import EVAL
from wtc.dt.attention import RECENCY_SLOPE
from wtc.dt.ple import ple_uniform
from wtc.extraction.routing_rules import Rule, candidate_rules, latest_rules, routed, rule_keys, satisfies

SNAP_MIN_RATE = 0.3      # a rule is tried on heads that follow it on at least this share of queries
SNAP_CANDIDATES = 3      # ... the best few per head
SNAP_GAIN = 0.9          # kept when the replica's loss after the head refit is below this share of before
SNAP_SEQUENCES = 256     # training sequences for the screen and the loss comparison
MAX_CONTENT = 1e5        # cap on the key score's range c N (float32 scores keep the tilt above rounding)


@dataclass
class Snap:
    replica: int
    head: str
    rule: str
    rate: float                  # the head's agreement with the rule before
    loss_before: float           # the replica's training loss (normalised units) after the head refit
    loss_after: float


def _pointers(attn, unit) -> torch.Tensor:
    """The frozen heads' argmax keys (R, B, H, T) from the reference scores."""
    return attn.scores(unit, attn.select(EVAL)).argmax(-1)


def _loss(model, x, y, valid) -> torch.Tensor:
    """Each replica's training loss after the exact head refit (R,): one forward, not two."""
    return refit_head(model, x, y, valid)


def realisable(rule: Rule) -> bool:
    return rule.kind in ("offset", "absolute", "window", "recent")


def _latest(attn, r: int, h: int, rule: Rule, key_var: int, unit: torch.Tensor, L: int):
    """(u, rel, abs) realising a "latest where" rule whose intervals are in the key's unit scale."""
    P, N = attn.P, attn.W.shape[-1]
    z = torch.unique(unit[r, :, :, key_var].double().flatten())
    big = 4.0 * RECENCY_SLOPE * L                      # a qualifying key beats any other at any distance
    want = torch.as_tensor(satisfies(rule.params, z.cpu().numpy()), dtype=torch.float64) * big
    # with a constant column: PLE(0) = 0, so only differences between levels are free (a constant
    # added to every key's score changes no argmax)
    X = torch.cat([ple_uniform(z, N), torch.ones_like(z)[:, None]], dim=1)
    u = (torch.linalg.pinv(X) @ want.to(z.device))[:N]       # the least-norm exact solution
    d = torch.arange(L, dtype=torch.float64)
    rel = -RECENCY_SLOPE * d
    rel[0] = -2.0 * big if rule.params["strict"] else 0.0
    abs_ = torch.zeros(L, dtype=torch.float64)
    pad_value = unit[r, 0, 0, key_var].double().cpu().numpy()
    if P and not bool(satisfies(rule.params, pad_value)):
        abs_[:P] = big / 2                             # none qualifies: a pad, not a key outside the predicate
    like = dict(dtype=attn.rel.dtype, device=attn.rel.device)
    return u.to(**like), rel.to(**like), abs_.to(**like)


def realise(attn, r: int, h: int, rule: Rule, key_var: int | None, unit: torch.Tensor) -> None:
    """Write `rule` into head h of replica r: its score is then the rule's key at every query.

    rel is indexed by the offset i + P - j, abs by the key position j (pads first); the score is
    exp(log_scale) * (u . PLE(z_k) + rel + abs) with W = 0. key_var: the stream variable a window
    rule scores (its k slot is set to it); unit: the (R, B, L, V) inputs of the layer, for the
    smallest step between the key variable's values.
    """
    P, L = attn.P, attn.P + attn.T
    N = attn.W.shape[-1]
    like = dict(dtype=attn.rel.dtype, device=attn.rel.device)
    tilt = torch.arange(L, **like)
    rel, abs_, u = torch.zeros(L, **like), torch.zeros(L, **like), torch.zeros(N, **like)
    p = rule.params
    if rule.kind == "recent":
        u, rel, abs_ = _latest(attn, r, h, rule, key_var, unit, L)
    elif rule.kind == "window":
        z = torch.unique(unit[r, :, :, key_var].double().flatten())
        step = float(z.diff().min()) if z.numel() > 1 else 1.0
        reach = min(4.0 * L / max(step, 1e-12), MAX_CONTENT)      # c N: one value step = 4 L tilt units
        big = 10.0 * (reach + 2 * L)
        u.fill_((1.0 if p["op"] == "max" else -1.0) * reach / N)
        end, w = p.get("end", 0), p["w"]
        inside = tilt >= end
        if w is not None:
            inside &= tilt < end + w
        rel = torch.where(inside, 0.0, -2 * big)
        abs_ = -tilt if p["ties"] == "first" else tilt.clone()
        if p["real"]:
            abs_[:P] -= big                  # pads only where the window holds no real key
    else:
        big = 10.0 * L
        if rule.kind == "offset":
            rel[p["d"]] = 2 * big
            if p.get("before", "pad") == "self":
                rel[0] = big
                abs_[:P] = -4 * big         # before t = d: the query itself, not a pad at offset d
            else:
                abs_[0] = big               # before t = d with no pad at offset d: key 0
        else:                                # absolute position p
            abs_[P + p["p"]] = 2 * big
            if p["before"] == "self":
                rel[0] = big
            else:
                abs_[0] = big
        abs_ -= tilt / L                    # any remaining tie to the earliest key, as argmax does
    with torch.no_grad():
        attn.W[r, h] = 0.0
        attn.u[r, h] = u
        attn.rel[r, h] = rel
        attn.abs[r, h] = abs_
        attn.log_scale[r, h] = 0.0
        if rule.kind in ("window", "recent"):
            if attn.content[r] == 0 and not bool(attn.recent[h]):   # other heads had no content score: keep them without one
                others = [g for g in range(attn.H) if g != h]
                attn.W[r, others] = 0.0
                attn.u[r, others] = 0.0
                attn.content[r] = 1.0
            attn.select.frozen_index[r, attn.H + h] = key_var


def _head_state(attn, r: int, h: int) -> tuple:
    return tuple(t.detach().clone() for t in (attn.W[r], attn.u[r], attn.rel[r, h], attn.abs[r, h],
                                                attn.log_scale[r, h], attn.select.frozen_index[r], attn.content[r]))


def _restore(attn, r: int, h: int, state: tuple) -> None:
    with torch.no_grad():
        attn.W[r], attn.u[r], attn.rel[r, h], attn.abs[r, h], attn.log_scale[r, h] = state[:5]
        attn.select.frozen_index[r] = state[5]
        attn.content[r] = state[6]


def _with_real_twins(tried: list, rated: list) -> list:
    """The candidates to try: `tried`, each window rule over pads followed by its twin over the
    real keys only. Pads hold 0 in every variable, the smallest value of a nonnegative input, so a
    content head learning a minimum is drawn onto them (running_min: the content heads of a
    population routed pads on 49-79% of queries) and agrees best with a rule that includes them;
    the twin is the rule it was approaching, and costs one loss evaluation."""
    def same(a: Rule, b: Rule) -> bool:
        return a.kind == b.kind and {**a.params, "real": True} == {**b.params, "real": True}

    out = []
    for c in tried:
        out.append(c)
        rule = c[1]
        if rule.kind == "window" and not rule.params["real"]:
            twin = next((d for d in rated if d[3] == c[3] and d[1].params["real"] and same(d[1], rule)), None)
            if twin is not None and not any(twin[1] is e[1] for e in out + tried):
                out.append(twin)
    return out


class _Screen:
    """Routed values of every candidate rule on one layer's inputs, cached per variable pair."""

    def __init__(self, stream: np.ndarray, P: int, T: int, shared: int, names: list[str], shared_cache: dict):
        self.stream, self.P, self.T, self.shared, self.names = stream, P, T, shared, names   # (R, B, L, V)
        self.cache: dict = {}
        self.shared_cache = shared_cache     # rules over inputs and positions only, kept across replicas

    def wanted(self, r: int, value_var: int, key_vars: list[int]) -> list[tuple[Rule, np.ndarray, int | None]]:
        out = []
        for kv in [None] + key_vars:
            common = value_var < self.shared and (kv is None or kv < self.shared)
            cache = self.shared_cache if common else self.cache
            tag = (value_var, kv) if common else (r, value_var, kv)
            if tag not in cache:
                v = self.stream[r, :, :, value_var]
                key_name = None if kv is None else self.names[kv]
                values = {" routed": v, **({key_name: self.stream[r, :, :, kv]} if kv is not None else {})}
                rules = [rule for rule in candidate_rules(self.T, [key_name] if kv is not None else [])
                         if (rule.kind == "window") == (kv is not None) and realisable(rule)]
                cache[tag] = [(rule, routed(v, rule_keys(rule, values, self.P, self.T), self.P), kv)
                              for rule in rules]
            out += cache[tag]
        return out


def _latest_candidates(screen: "_Screen", unit: torch.Tensor, r: int, value_var: int, key_vars: list[int],
                       pointer: np.ndarray) -> list[tuple[Rule, np.ndarray, int]]:
    """"latest where" rules read from where the head stops (routing_rules.latest_rules), their
    predicates on the key's unit scale (what realise writes), with what each routes."""
    out = []
    v = screen.stream[r, :, :, value_var]
    for kv in key_vars:
        values = {"k": unit[r, :, :, kv].double().cpu().numpy()}
        for rule in latest_rules(pointer, values, ["k"], screen.P, screen.T):
            out.append((rule, routed(v, rule_keys(rule, values, screen.P, screen.T), screen.P), kv))
    return out


@torch.no_grad()
def snap_heads(model, x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor, until: float | None = None) -> list[Snap]:
    """Snap the pointer heads of a frozen population where that lowers a replica's loss (in place).
    Replica by replica, on a one-replica copy (replicas are independent: a candidate's loss is then
    one replica's forward and head refit, not the whole population's; eight replicas, 256
    sequences: 3.5 -> 1.1 s on product_last2, 4.8 -> 1.4 s on free_fall_height, the same snaps),
    written back where a head was snapped. The output heads of snapped replicas are left as the
    last candidate's refit: the caller refits the head on its own data.
    until (time.time() seconds): no head is started after it (the heads done so far stay snapped).
    Returns the snaps kept, in the order made."""
    if not any(b.attn is not None and b.attn.H for b in model.blocks):
        return []
    loss = _loss(model, x, y, valid)                                              # (R,)
    if bool((loss < EXACT_FIT).any()):
        return []
    shared_rules: dict = {}        # what the rules route on inputs and positions: the same in every replica
    kept: list[Snap] = []
    for r in range(model.R):
        if until is not None and time.time() >= until:
            break
        one = model.select_replicas([r])
        snaps = _snap_replica(one, x, y, valid, loss[r:r + 1], shared_rules, until)
        if snaps:
            model.assign_replicas([r], one)
            kept += [replace(s, replica=r) for s in snaps]
    return kept


def _snap_replica(model, x, y, valid, loss: torch.Tensor, shared_rules: dict, until: float | None) -> list[Snap]:
    """snap_heads on a one-replica model (in place); loss: its loss after the head refit (1,)."""
    shared = model.n_inputs + 1                                                   # inputs and pos: one copy
    kept: list[Snap] = []
    r = 0
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        if attn is None or not attn.H:
            continue
        H, P, T = attn.H, attn.P, attn.T
        stream, unit = _inputs_of(model, attn, x)
        screen = _Screen(stream.double().cpu().numpy(), P, T, shared, list(model.variable_names),
                         shared_rules.setdefault(layer, {}))
        idx = attn.select.index()
        pointers = _pointers(attn, unit).cpu().numpy()                            # (1, B, H, T)
        for h in range(H):
            if until is not None and time.time() >= until:
                return kept
            if float(loss[r]) < EXACT_FIT:                                        # exact now: rounding noise is no gain
                break
            value_var, key_var = int(idx[r, 2 * H + h]), int(idx[r, H + h])
            got = routed(screen.stream[r, :, :, value_var], pointers[r, :, h], P)
            scale = 1.0 + np.abs(got)
            key_vars = sorted({value_var, key_var} if attn.content[r] else {value_var})
            key_vars = [k for k in key_vars if bool(attn.select.mask[H + h, k])]
            recent = bool(attn.recent[h])
            if recent:
                key_vars = [key_var]
            rated = []
            candidates = (_latest_candidates(screen, unit, r, value_var, key_vars, pointers[r, :, h]) if recent
                          else screen.wanted(r, value_var, key_vars))
            for rule, want, kv in candidates:
                rate = float((np.abs(got - want) <= 1e-9 * scale).mean())
                rated.append((rate, rule, want, kv))
            if not rated or max(rate for rate, *_ in rated) >= 1.0:
                continue                                                          # already a rule
            tried = _with_real_twins([c for c in sorted(rated, key=lambda c: -c[0])
                                      if c[0] >= SNAP_MIN_RATE][:SNAP_CANDIDATES], rated)
            best = None                       # the candidate with the lowest loss wins, not the first
            state = _head_state(attn, r, h)
            for rate, rule, want, kv in tried:
                realise(attn, r, h, rule, kv, unit)
                now = routed(screen.stream[r, :, :, value_var], _pointers(attn, unit)[r, :, h].cpu().numpy(), P)
                if np.allclose(now, want, rtol=1e-9, atol=1e-12):                  # what the rule routes
                    after = _loss(model, x, y, valid)
                    if float(after[r]) < SNAP_GAIN * float(loss[r]) and (best is None or after[r] < best[0][r]):
                        best = (after, rate, rule, kv)
                _restore(attn, r, h, state)
            if best is not None:
                after, rate, rule, kv = best
                realise(attn, r, h, rule, kv, unit)
                kept.append(Snap(r, attn.head_names[h], rule.describe(), rate, float(loss[r]), float(after[r])))
                loss = after
                pointers = _pointers(attn, unit).cpu().numpy()
    return kept
