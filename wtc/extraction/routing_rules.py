"""Routing hypotheses: what rule does a pointer head follow?

For every (sequence, query position t) we know the key the frozen head picked. Candidate rules,
simplest first:

  offset(d)        key = t - d; before the start (t < d) the key is a pad, where every variable is 0,
                   or (variant "self") the query's own position
  absolute(p)      key = p; for t < p the key is a pad ("before_pad") or t itself ("before_self")
  switch(q)        key = t - d(q_t): the offset is looked up from the query variable's value
                   (variables with at most 4 distinct values, e.g. a flag: v_t if f_t else v_{t-1});
                   a value at which the head goes to the pads reads "nothing" (d = None: 0, a
                   product x * f as "x where f"), not the offset the pads happen to sit at for the
                   length trained on, which would read real positions at longer lengths
  window max/min   key = argmax/argmin of a variable u over [t-w+1, t] (w >= 2) or the whole prefix,
                   or over the w positions before t ([t-w, t-1], "previous");
                   "real": pads excluded; ties go to the earliest ("first") or latest ("last") key
  latest where     key = the latest j < t ("strict") or j <= t whose key variable k_j satisfies a
                   predicate; when none does, a pad (0; "none": "pad") or the latest key of any
                   value ("latest": t - 1 or t, for a head with no pull toward the pads). The predicate is a union of open intervals
                   of k with bounds midway between the values seen (a set of values for a key with
                   few of them, a threshold for one with many); it is read from the pointers
                   themselves: values the head stops at are in it, values it skips over are not
                   (recency heads, wtc.dt.attention; a carry, the last value seen, the last non-zero)

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

    kind: str                    # "offset" | "absolute" | "switch" | "recent" | "compare" | "window"
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
            table = ", ".join(f"{_num(k)}: {'0 (nothing)' if d is None else f't-{d}'}" for k, d in p["table"])
            return f"offset chosen by {p['var']}: {{{table}}}"
        if self.kind == "recent":
            none = "0" if p.get("none", "pad") == "pad" else f"t{'-1' if p['strict'] else ''}"
            return f"latest j {'<' if p['strict'] else '<='} t where {predicate_text(p)} ({none} if none)"
        if self.kind == "compare":
            return (f"latest j {'<' if p['strict'] else '<='} t where {p['var']}_j {p['op']} {p['query']}_t "
                    f"(0 if none)")
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
MAX_SET_LEVELS = 16      # a "latest where" key with more distinct values gets a threshold, not a set
COMPARISONS = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}


def satisfies(params: dict, k: np.ndarray) -> np.ndarray:
    """Whether key values k satisfy a "latest where" rule's predicate (its open intervals)."""
    ok = np.zeros(np.shape(k), dtype=bool)
    for lo, hi in params["intervals"]:
        ok |= (k > (-math.inf if lo is None else lo)) & (k < (math.inf if hi is None else hi))
    return ok


def predicate_text(params: dict, name: str | None = None) -> str:
    """The predicate as a Python condition on `name` (the key variable by default): its intervals,
    or the complement's when that is shorter ("not 0.5 < s < 1.5" for s != 1 of 0, 1, 2)."""
    k = params["var"] if name is None else name

    def chain(intervals):
        parts = []
        for lo, hi in intervals:
            parts.append(" < ".join([*([_num(lo)] if lo is not None else []), k, *([_num(hi)] if hi is not None else [])]))
        return " or ".join(parts) if parts else "False"

    inside = [tuple(iv) for iv in params["intervals"]]
    cuts = sorted({b for iv in inside for b in iv if b is not None})
    edges = [None] + cuts + [None]       # every segment between cuts is an interval or a gap between two
    outside = [seg for seg in zip(edges[:-1], edges[1:]) if seg not in inside]
    if len(outside) == 1 and len(inside) > 1:
        return f"not {chain(outside)}"
    return chain(inside)


def _between(a: float, b: float) -> float:
    """The simplest number strictly between two levels (an integer, a half, a tenth, ...), the one
    nearest their midpoint: the program then reads "not -1 < m0 < 1", not "not -0.7615 < m0 < 0.835"."""
    mid = (a + b) / 2
    for digits in range(0, 13):
        for step in (10.0 ** -digits, 0.5 * 10.0 ** -digits):
            c = round(mid / step) * step
            for v in (round(c, digits + 1), round(c - step, digits + 1), round(c + step, digits + 1)):
                if a < v < b:
                    return float(v)
    return float(mid)


def _intervals(levels: np.ndarray, member: np.ndarray) -> list[list]:
    """Open intervals (None: unbounded) covering the member levels, bounds between levels (_between)."""
    out, start = [], None
    for i, m in enumerate(member):
        if m and start is None:
            start = i
        if m and (i == len(member) - 1 or not member[i + 1]):
            lo = None if start == 0 else _between(float(levels[start - 1]), float(levels[start]))
            hi = None if i == len(levels) - 1 else _between(float(levels[i]), float(levels[i + 1]))
            out.append([lo, hi])
            start = None
    return out


def latest_rules(pointer: np.ndarray, values: dict[str, np.ndarray], key_vars: list[str], P: int, T: int) -> list[Rule]:
    """"latest where" candidates for each key variable, both strict and not, with the predicate
    read from where the head stops: a value it stops at more often than it skips over it is in.
    Many distinct values: the best single threshold (k above or below a cut) instead."""
    rules = []
    n, L = pointer.shape[0], P + T
    j = np.arange(L)[None, None, :]
    t = P + np.arange(T)[None, :, None]
    picked = j == pointer[:, :, None]                                             # (n, T, L)
    for var in key_vars:
        k = values[var]                                                            # (n, L)
        levels, inverse = np.unique(k, return_inverse=True)
        inverse = inverse.reshape(k.shape)
        for strict in (True, False):
            skipped = (j > pointer[:, :, None]) & (j <= t - int(strict))             # passed over
            stop = np.bincount(np.broadcast_to(inverse[:, None, :], picked.shape)[picked], minlength=len(levels))
            skip = np.bincount(np.broadcast_to(inverse[:, None, :], skipped.shape)[skipped], minlength=len(levels))
            if len(levels) <= MAX_SET_LEVELS:
                member = stop > skip
            else:            # one cut: members above it, or below it, whichever explains more stops and skips
                above = np.cumsum((stop - skip)[::-1])[::-1]                               # sum over levels >= i
                below = np.cumsum(stop - skip)                                            # sum over levels <= i
                i_up, i_down = int(above.argmax()), int(below.argmax())
                member = np.arange(len(levels)) >= i_up if above[i_up] >= below[i_down] else np.arange(len(levels)) <= i_down
            # the pads' value is stopped at where nothing else can be (t = 0), never skipped over:
            # its membership is tried both ways
            flipped = member.copy()
            if P:
                flipped[inverse[0, 0]] = not member[inverse[0, 0]]
            for m in (member, flipped) if P else (member,):
                if not m.any() or m.all():
                    continue
                params = {"var": var, "strict": strict, "intervals": _intervals(levels, m)}
                rules.append(Rule("recent", {**params, "none": "pad"}))
                if P and not satisfies(params, k[0, 0]):     # pads outside the predicate: "none" can happen
                    rules.append(Rule("recent", {**params, "none": "latest"}))
    return rules


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
        nothing = np.zeros_like(q, dtype=bool)
        for value, offset in p["table"]:
            if offset is None:
                nothing |= q == value
            else:
                d = np.where(q == value, offset, d)
        return np.where(nothing, 0, np.maximum(P + t - d, 0))
    if kind == "recent":
        ok = satisfies(p, values[p["var"]])                                     # (n, L)
        L = ok.shape[1]
        last = np.where(ok, np.arange(L)[None, :], -1)
        last = np.maximum.accumulate(last, axis=1)                              # latest satisfying j <= index
        hi = P + np.arange(T) - int(p["strict"])
        keys = np.where(hi >= 0, last[:, np.maximum(hi, 0)], -1)
        fallback = 0 if p.get("none", "pad") == "pad" else np.maximum(hi, 0)    # a pad, or the latest key
        return np.where(keys >= 0, keys, fallback)
    if kind == "compare":
        k, q = values[p["var"]], values[p["query"]][:, P:]                      # (n, L), (n, T)
        j = np.arange(k.shape[1])[None, None, :]
        hi = (P + np.arange(T) - int(p["strict"]))[None, :, None]
        ok = COMPARISONS[p["op"]](k[:, None, :], q[:, :, None]) & (j >= P) & (j <= hi)   # (n, T, L)
        last = np.where(ok, j, -1).max(-1)
        return np.where(last >= 0, last, 0)                                     # none: a pad (0)
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


def compare_rules(key_vars: list[str], query_vars: list[str]) -> list[Rule]:
    """A content head's "latest j before t (or at t) whose key compares so with the query at t, a
    pad if none": a head that finds an earlier value above x_t (a descent: the prefix is no longer
    sorted) routes one, and which one rarely matters downstream."""
    return [Rule("compare", {"var": k, "query": q, "op": op, "strict": strict})
            for k in key_vars for q in query_vars for op in COMPARISONS for strict in (True, False)]


def switch_rules(pointer: np.ndarray, values: dict[str, np.ndarray], query_vars: list[str], P: int, T: int) -> list[Rule]:
    """For each few-valued query variable: the offset the head takes most often per value, or
    None (nothing: a pad) where it goes to the pads more often than not."""
    rules = []
    offsets = P + np.arange(T)[None, :] - pointer                                   # (n, T)
    for var in query_vars:
        q = values[var][:, P:]
        levels = np.unique(q)
        if not 2 <= len(levels) <= MAX_SWITCH_VALUES:
            continue
        table = []
        for level in levels:
            at = q == level
            if np.mean(pointer[at] < P) > 0.5:
                table.append((float(level), None))
                continue
            picked = offsets[at]
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
    variables a content head scores keys / queries by (window_vars are also the keys of the
    "latest where" candidates).
    """
    v = values[value_var]
    got = routed(v, pointer, P)
    scale = 1.0 + np.abs(got)
    key_vars = window_vars
    window_vars = list(dict.fromkeys([value_var] + list(window_vars or [])))
    tested = []
    rules = candidate_rules(T, window_vars)
    n_simple = next(i for i, r in enumerate(rules) if r.kind == "window") if any(r.kind == "window" for r in rules) else len(rules)
    rules[n_simple:n_simple] = (switch_rules(pointer, values, list(query_vars or []), P, T)
                                + latest_rules(pointer, values, list(key_vars or []), P, T))
    rules += compare_rules(list(key_vars or []), list(query_vars or []))     # after every established reading
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
