"""Heads that fit no routing rule but whose misses do not matter.

A pointer head can follow a rule everywhere that counts and differ where it makes no difference:
the window head of a maximum that, at t = 2, looks at x_t itself instead of a pad (the maximum is
the same), agreement 0.90 — below any rule's threshold, yet the program with the rule computes
what the model computes. The test is on the outputs, not the keys: every output must be a formula
of inputs and routed values only, and give the same decisions (integer tasks; real ones: within
the task's tolerance) with the head's own keys as with its best rule's. Such a head is read as
its rule; its reading says so; the program is then verified on fresh data like any other.
"""
from __future__ import annotations

import numpy as np
import sympy as sp

from wtc.extraction.verification import agreement

IMMATERIAL_RATE = 0.8    # a head's best rule must agree at least this often to be considered


def immaterial_heads(task, outputs: list[sp.Expr], view: dict[str, np.ndarray], unread: dict) -> list[str]:
    """Heads whose misses change no output. outputs: the program's output formulas; view: program
    name -> (n, T) values as the model routes them (inputs and routed values); unread: program name
    of a head that fits no rule -> (head, best rule, (n, T) values the rule routes)."""
    symbols = sorted({sym for e in outputs for sym in e.free_symbols}, key=lambda sym: sym.name)
    if not unread or not symbols or any(sym.name not in view for sym in symbols):
        return []            # an output reads something that is not a plain routed value: not decidable here
    functions = [sp.lambdify(symbols, e, modules=["numpy"]) for e in outputs]
    shape = view[symbols[0].name].shape

    def evaluate(values):                                                   # (n, T, O)
        with np.errstate(all="ignore"):
            cols = [np.broadcast_to(np.asarray(f(*[values[sym.name] for sym in symbols]), dtype=float), shape)
                    for f in functions]
        return np.stack(cols, axis=-1)

    base = evaluate(view)
    return [head for name, (head, rule, values) in unread.items()
            if rule.rate >= IMMATERIAL_RATE and agreement(task, evaluate({**view, name: values}), base) == 1.0]
