"""When discover starts with a running sum of a learned step: the probe's evidence that
y_t - y_(t-1), plain or modulo P, is one function g of the inputs at t (wtc.tasks.probe,
Dependence.step_modulus), and g is not affine in them.

Such a target is sum_{j <= t} g(x_j) (mod P): a count of the even values so far, the parity of
a dot product. One layer cannot compute it: its aggregate heads sum what the stream holds before
any sub-MLP runs (x, not g(x)). Two layers can: sub-MLPs in the first compute g at every position,
sum heads in the second add it up, and the second layer's sub-MLPs take the residue (periodic
units of period P). Where g is affine (a plain sum, a counter mod k) the first layer adds nothing
and the layout is left alone.

A running sum of a running sum of an affine g (step_order 2: a position under forces x_t, a double
prefix sum) gets sum heads in both layers: the first sums x, the second sums the first's sums. One
layer has no second sum to take, and the ladder reaches two layers only at its third or fourth rung
(seed 0: a double prefix sum declared with lambdas verified at the third after 66 s of one-layer
rungs, in 2.5 s as the first rung; MIPS's Newton_Gravity verified in 27-31 s, unsolved in 530 s by
the ladder). A non-affine g at order 2 would need a third layer; the layout is then left to the
ladder.
"""
from __future__ import annotations

STEP_LAYOUT = {"n_layers": 2, "n_heads": (0, 0), "n_mlps": (2, 2), "n_agg_heads": (0, 2), "agg_ops": ("sum",)}
SUM_OF_SUMS_LAYOUT = {**STEP_LAYOUT, "n_agg_heads": (2, 2)}
LAYOUT_FIELDS = ("n_layers", "n_heads", "n_mlps", "n_recent_heads", "n_agg_heads", "agg_ops")


def step_layout(config, dep, periods: tuple[int, ...]) -> tuple[dict, str]:
    """(DTConfig changes, why) for discover's first architecture when the probe found a running
    sum of a non-affine step, or a running sum of a running sum of an affine one, and the given
    config leaves the layout at DTConfig's defaults; the step's modulus joins `periods`
    (discover's periodic units) as the second layer's residue. ({}, "") otherwise."""
    from wtc.dt.config import DTConfig

    P, order = getattr(dep, "step_modulus", None), getattr(dep, "step_order", 1)
    if P is None or dep.step_affine != (order == 2):
        return {}, ""
    default = DTConfig()
    if not all(getattr(config, f) == getattr(default, f) for f in LAYOUT_FIELDS):
        return {}, ""
    if order == 2:
        return dict(SUM_OF_SUMS_LAYOUT), ("sum heads in two layers (y_t - 2 y_(t-1) + y_(t-2) is an affine function of "
                                          "the inputs at t: y is a running sum of a running sum)")
    changes = dict(STEP_LAYOUT)
    why = "sub-MLPs, then sum heads in a second layer (y_t - y_(t-1)"
    why += f" mod {P}" if P else ""
    why += " is a function of the inputs at t that no sum head reads directly)"
    if P and not config.mlp_periods:
        changes["mlp_periods"] = tuple(sorted(set(periods) | {P}))
    return changes, why
