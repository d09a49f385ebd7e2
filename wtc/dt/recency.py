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


def latest_evidence(dep) -> str:
    """A sentence naming the tail when the probe shows one, else "" (no evidence)."""
    tail = tail_offsets(dep)
    if not tail:
        return ""
    names = ["x"] if len(dep.offsets) == 1 else [f"x{c}" for c in range(len(dep.offsets))]
    shown = ", ".join(f"{names[c]}_(t-{d})" for c, d in tail)
    return f"reads {shown} at some positions only (a tail no fixed window explains)"


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
