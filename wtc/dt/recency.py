"""When discover starts with recency heads: the probe's evidence for a "latest j where pred" read.

A target that reads x_(t-d) for a fixed set of offsets changes with those inputs at (nearly) every
output position and with no other: the probe's dependence table (wtc.tasks.probe) is a band. A
target that reads the latest position satisfying a predicate (a carry: the latest digit sum that is
not base - 1; the last non-zero) reads x_(t-d) only when nothing between t - d and t qualifies, a
chance that falls geometrically with d: the near offsets show at every output position, and
beyond them a tail of offsets that show at some positions only (in a few of the probe's
sequences). That tail is what no window explains: a window as long as it would read those offsets
everywhere. Evidence here is such a tail (offsets read at some but fewer than wtc.tasks.probe.SHARE
of the output positions, not explained by an absolute position) beyond a band of offsets 0, 1, ..
read at every position, in a channel the probe did not find read whole (no prefix flag). The band
is what tells a recency read from one of the whole prefix that shows rarely ("any one so far": its
early inputs matter only while every later one is 0, so which offsets show depends on t, and the
offsets read everywhere are scattered or none).

With few symbols a carry's chain reaches every offset in some sequence of the probe (binary
addition: the table is full, the channel looks read whole), so the band and tail are gone. What
stays is the rate (Dependence.rates): the share of swaps of x_(t-d) that move y_t falls by a
constant factor with each step back (1/2 a step for base 2, 1/3 for base 3) and is the same at
every output position, because the chance that nothing between t - d and t qualifies depends on
d alone. No other read does that: a window's rate drops to exactly zero past its end, a prefix
sum's or a counter's stays flat, a prefix extremum's falls with t (the longer the prefix, the less
one value matters) rather than with d, a majority's falls slowly.
"""
from __future__ import annotations

import numpy as np

RECENT_LAYOUT = {"n_layers": 2, "n_heads": (0, 2), "n_recent_heads": (0, 2), "n_mlps": (2, 2)}


def tail_offsets(dep) -> list[tuple[int, int]]:
    """(channel, offset) pairs read at some output positions but not found as fixed offsets,
    beyond every offset found in that channel (see the module docstring)."""
    from wtc.tasks.probe import SHARE

    table = np.asarray(dep.table, dtype=bool)                     # (channels, T source, T output)
    out = []
    for c in range(table.shape[0]):
        reach = max(dep.offsets[c], default=-1)
        if dep.prefix[c] or reach < 1 or sorted(dep.offsets[c]) != list(range(reach + 1)):
            continue
        T = table.shape[1]
        for d in range(reach + 1, T - 1):                         # offsets with two or more positions to show
            t = np.arange(d, T)
            j = t - d
            share = float((table[c, j, t] & ~np.isin(j, dep.absolute[c])).mean())
            if 0 < share < SHARE:
                out.append((c, d))
    return out


DECAY = 0.75        # each step back keeps at most this share of the rate before it
RATE_FLOOR = 0.03   # rates below this are the probe's noise: the decay is followed down to here
FLAT = 0.35         # early and late output positions' rates differ by at most this share of their mean


def decaying_rates(dep) -> list[tuple[int, list[float]]]:
    """(channel, mean rate per offset from 1) for channels whose rate falls geometrically with the
    offset and not with the output position (see the module docstring)."""
    from wtc.tasks.probe import SHARE

    if dep.rates is None:
        return []
    rates = np.asarray(dep.rates, dtype=float)                 # (channels, T source, T output)
    T = rates.shape[1]
    out = []
    for c in range(rates.shape[0]):
        by_offset, flat = [], True
        for d in range(1, T - 1):
            r = np.array([rates[c, t - d, t] for t in range(d, T)])
            r = r[np.isfinite(r)]
            if len(r) < 2:
                break
            mean = float(r.mean())
            half = len(r) // 2
            if mean >= RATE_FLOOR and abs(r[:half].mean() - r[half:].mean()) > FLAT * mean:
                flat = False
            by_offset.append(mean)
        start = next((i for i, m in enumerate(by_offset) if m < SHARE), None)
        if not flat or start is None or start > 1:            # the decay starts at offset 1 or 2
            continue
        steps = 0
        for i in range(start, len(by_offset) - 1):
            here, there = by_offset[i], by_offset[i + 1]
            if here < RATE_FLOOR:
                break
            if there > DECAY * here or (there == 0 and here > 2 * RATE_FLOOR):   # not falling, or cut off: a window
                steps = 0
                break
            steps += 1
        if steps >= 2:
            out.append((c, [round(m, 3) for m in by_offset]))
    return out


def latest_evidence(dep) -> str:
    """A sentence naming the tail or the decaying rates when the probe shows them, else "" (no
    evidence)."""
    names = ["x"] if len(dep.offsets) == 1 else [f"x{c}" for c in range(len(dep.offsets))]
    tail = tail_offsets(dep)
    if tail:
        shown = ", ".join(f"{names[c]}_(t-{d})" for c, d in tail)
        return f"reads {shown} at some positions only (a tail no fixed window explains)"
    decay = decaying_rates(dep)
    if decay:
        shown = "; ".join(f"{names[c]}: " + ", ".join(f"{m:.2f}" for m in ms[:4]) for c, ms in decay)
        return (f"reads x_(t-d) with a chance that falls geometrically with d, the same at every position "
                f"({shown} for d = 1, 2, ..)")
    return ""


def recent_layout(config, dep) -> tuple[dict, str]:
    """(DTConfig changes, why) for discover's first architecture: two layers, sub-MLPs in the
    first (a key such as a digit sum), two recency heads and sub-MLPs in the second, when the
    probe shows a tail (latest_evidence) and the given config leaves the layout at DTConfig's
    defaults; ({}, "") otherwise."""
    from wtc.dt.config import DTConfig

    default = DTConfig()
    untouched = all(getattr(config, f) == getattr(default, f) for f in ("n_layers", "n_heads", "n_mlps", "n_recent_heads"))
    evidence = latest_evidence(dep) if untouched else ""
    if not evidence:
        return {}, ""
    return dict(RECENT_LAYOUT), f"recency heads in a second layer (the target {evidence})"
