"""Routing hypotheses: what rule does a pointer head follow?

For every (sequence, query position t) we know the key the frozen head picked. Candidate rules,
simplest first:

  offset(d)        key = t - d; before the start (t < d) the key is a pad, where every variable is 0,
                   or (variant "self") the query's own position
  absolute(p)      key = p; for t < p the key is a pad ("before_pad") or t itself ("before_self")
  switch(q)        key = t - d(q_t): the offset is looked up from the query variable's value
                   (variables with at most 4 distinct values, e.g. a flag: v_t if f_t else v_{t-1})
  window max/min   key = argmax/argmin of a variable u over [t-w+1, t] (w >= 2) or the whole prefix,
                   or over the w positions before t ([t-w, t-1], "previous");
                   "real": pads excluded; ties go to the earliest ("first") or latest ("last") key

A rule is accepted when the routed values agree with what the rule routes (pads all route 0, so
which pad is immaterial) at a rate whose one-sided binomial lower confidence bound (Clopper-Pearson,
99%) is at least `min_rate` (0.999). One relaxation, for extrema only: a content head learns an
argmax as a softmax over its keys' scores, which is exact except where two values are nearly equal.
A window or prefix max/min rule that agrees at NEAR_TIE_RATE or more, where every disagreement
routes a value within NEAR_TIE_GAP of the variable's spread from the extremum, is accepted as the
head's reading with its near-ties resolved (Rule.near_ties says how close the misses came); the
program then stands or falls by verification on fresh data, as every program does. A head that
fits no rule is reported with the evidence of the best candidates; nothing is guessed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MIN_RATE = 0.999
NEAR_TIE_RATE = 0.98     # an extremum rule with misses only at near-ties: at least this agreement
NEAR_TIE_GAP = 0.15      # ... and every missed value this close to the extremum (share of the spread;
#                          a soft argmin over 0..99 seen missing by 3 units at the median, 12 at most)
CONFIDENCE = 0.99


def binomial_lower_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson lower bound on p given k successes in n trials."""
    if n <= 0:
        return 0.0
    if k <= 0:
        return 0.0
    alpha = 1.0 - confidence
    if k == n:
        return alpha ** (1.0 / n)

    def upper_tail(p: float) -> float:   # P(X >= k | n, p), summed from the short side
        log_p, log_q = math.log(p), math.log1p(-p)
        if n - k < k:   # P(X >= k) = 1 - P(X <= k - 1); sum the (few) terms i >= k
            terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
                     for i in range(k, n + 1)]
        else:
            terms = None
        if terms is not None:
            m = max(terms)
            return math.exp(m) * sum(math.exp(t - m) for t in terms)
        lower = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
                 for i in range(0, k)]
        m = max(lower)
        return max(0.0, 1.0 - math.exp(m) * sum(math.exp(t - m) for t in lower))

    lo, hi = 0.0, k / n
    for _ in range(60):   # upper_tail is increasing in p; find p with upper_tail(p) = alpha
        mid = 0.5 * (lo + hi)
        if mid <= 0:
            break
        if upper_tail(mid) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class Rule:
    """A routing rule with its evidence on fresh data."""

    kind: str                    # "offset" | "absolute" | "window" | "aggregate"
    params: dict
    agree: int = 0
    n: int = 0
    near_ties: float | None = None   # accepted with near-ties resolved: the largest miss / spread

    @property
    def rate(self) -> float:
        return self.agree / self.n if self.n else 0.0

    @property
    def lower_bound(self) -> float:
        return binomial_lower_bound(self.agree, self.n)

    def describe(self) -> str:
        p = self.params
        if self.kind == "offset":
            if p["d"] == 0:
                return "current position"
            before = "0 before the start" if p.get("before", "pad") == "pad" else "t itself while t < d"
            return f"offset {p['d']} (t-{p['d']}; {before})"
        if self.kind == "absolute":
            return f"absolute position {p['p']}" + ("" if p["p"] == 0 else f" ({p['before']} before it)")
        if self.kind == "switch":
            table = ", ".join(f"{_num(k)}: t-{d}" for k, d in p["table"])
            return f"offset chosen by {p['var']}: {{{table}}}"
        if self.kind == "window":
            span = "whole prefix" if p["w"] is None else f"last {p['w']} positions"
            if p.get("end", 0):
                span = "whole prefix before t" if p["w"] is None else f"{p['w']} positions before t"
            pads = "" if p["real"] else ", pads (0) included"
            tie = "" if self.near_ties is None else f" (near-ties resolved: misses within {self.near_ties:.3g} of the spread)"
            return f"arg{p['op']} of {p['var']} over the {span}{pads}, ties {p['ties']}{tie}"
        return "mean over the prefix"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


MAX_SWITCH_VALUES = 4


@dataclass
class RoutingFit:
    head: str
    rule: Rule | None            # None: uninterpretable
    candidates: list[Rule] = field(default_factory=list)   # best few, with evidence

    @property
    def interpretable(self) -> bool:
        return self.rule is not None


def rule_keys(rule: Rule, values: dict[str, np.ndarray], P: int, T: int) -> np.ndarray:
    """Key index (n, T) the rule picks, in stream coordinates (pads 0..P-1, position t at P + t)."""
    n = next(iter(values.values())).shape[0]
    t = np.arange(T)[None, :].repeat(n, 0)
    kind, p = rule.kind, rule.params
    if kind == "offset":
        key = P + t - p["d"]
        if p.get("before", "pad") == "self":
            return np.where(t >= p["d"], key, P + t)
        return np.maximum(key, 0)
    if kind == "absolute":
        fallback = np.zeros_like(t) if p["before"] == "pad" else P + t
        return np.where(t >= p["p"], P + p["p"], fallback)
    if kind == "switch":
        q = values[p["var"]][:, P:]                                             # (n, T)
        d = np.zeros_like(t)
        for value, offset in p["table"]:
            d = np.where(q == value, offset, d)
        return np.maximum(P + t - d, 0)
    if kind == "window":
        u = values[p["var"]]                                                    # (n, L)
        sign = 1.0 if p["op"] == "max" else -1.0
        L = u.shape[1]
        keys = np.empty((n, T), dtype=np.int64)
        for q in range(T):
            hi = P + q - p.get("end", 0)
            lo = 0 if p["w"] is None else hi - p["w"] + 1
            lo = max(lo, P) if p["real"] else max(lo, 0)
            if hi < lo:        # nothing but pads before the start
                keys[:, q] = 0
                continue
            seg = sign * u[:, lo:hi + 1]
            if p["ties"] == "first":
                keys[:, q] = lo + seg.argmax(1)
            else:
                keys[:, q] = hi - seg[:, ::-1].argmax(1)
        assert L >= P + T
        return keys
    raise ValueError(f"rule kind {kind!r} has no key")


def routed(v: np.ndarray, keys: np.ndarray, P: int) -> np.ndarray:
    """Values of v (n, L) at keys (n, T); pads route 0."""
    out = np.take_along_axis(v, keys, axis=1)
    return np.where(keys < P, 0.0, out)


def candidate_rules(T: int, window_vars: list[str]) -> list[Rule]:
    """All rules, simplest first."""
    rules = [Rule("offset", {"d": d}) for d in range(T)]
    rules += [Rule("offset", {"d": d, "before": "self"}) for d in range(1, T)]
    rules += [Rule("absolute", {"p": p, "before": b}) for p in range(T) for b in (("pad",) if p == 0 else ("pad", "self"))]
    for var in window_vars:
        for end, widths in ((0, range(2, T + 1)), (1, range(2, T))):
            for w in [None] + list(widths):      # the whole prefix first: at w = T it routes the same
                #                                  on the training length and it is the reading that holds beyond
                for op in ("max", "min"):
                    for real in (True, False):
                        for ties in ("first", "last"):
                            rules.append(Rule("window", {"var": var, "op": op, "w": w, "real": real, "ties": ties,
                                                         "end": end}))
    return rules


def switch_rules(pointer: np.ndarray, values: dict[str, np.ndarray], query_vars: list[str], P: int, T: int) -> list[Rule]:
    """For each few-valued query variable: the offset the head takes most often per value."""
    rules = []
    offsets = P + np.arange(T)[None, :] - pointer                                   # (n, T)
    for var in query_vars:
        q = values[var][:, P:]
        levels = np.unique(q)
        if not 2 <= len(levels) <= MAX_SWITCH_VALUES:
            continue
        table = []
        for level in levels:
            picked = offsets[q == level]
            table.append((float(level), int(np.bincount(np.minimum(picked, T)).argmax())))
        if len({d for _, d in table}) > 1:
            rules.append(Rule("switch", {"var": var, "table": table}))
    return rules


def fit_head(head: str, pointer: np.ndarray, value_var: str, values: dict[str, np.ndarray], P: int, T: int,
             window_vars: list[str] | None = None, min_rate: float = MIN_RATE, atol: float = 1e-9,
             query_vars: list[str] | None = None) -> RoutingFit:
    """Test rules for one head.

    pointer (n, T): keys the head picked; values: {variable: (n, L)} in program units with the pads
    in front (zeros); value_var: the variable the head routes; window_vars / query_vars: the
    variables a content head scores keys / queries by.
    """
    v = values[value_var]
    got = routed(v, pointer, P)
    scale = 1.0 + np.abs(got)
    window_vars = list(dict.fromkeys([value_var] + list(window_vars or [])))
    tested = []
    rules = candidate_rules(T, window_vars)
    n_simple = next(i for i, r in enumerate(rules) if r.kind == "window") if any(r.kind == "window" for r in rules) else len(rules)
    rules[n_simple:n_simple] = switch_rules(pointer, values, list(query_vars or []), P, T)
    near = None                  # the best extremum rule whose misses are all near-ties
    for rule in rules:
        want = routed(v, rule_keys(rule, values, P, T), P)
        ok = np.abs(got - want) <= atol * scale
        rule.agree, rule.n = int(ok.sum()), int(ok.size)
        tested.append(rule)
        if rule.rate >= min_rate and rule.lower_bound >= min_rate:
            return RoutingFit(head, rule, sorted(tested, key=lambda r: -r.rate)[:5])
        if rule.kind == "window" and rule.rate >= NEAR_TIE_RATE:
            spread = float(np.ptp(v[:, P:])) or 1.0
            gap = float(np.abs(got - want)[~ok].max(initial=0.0)) / spread
            if gap <= NEAR_TIE_GAP and (near is None or rule.rate > near.rate):
                rule.near_ties, near = gap, rule
    return RoutingFit(head, near, sorted(tested, key=lambda r: -r.rate)[:5])
