"""When discover starts with a running sum of a learned step: the probe's evidence that
y_t - y_(t-1), plain or modulo P, is one function g of the inputs at t (wtc.tasks.probe,
Dependence.step_modulus), and g is not affine in them.

Such a target is sum_{j <= t} g(x_j) (mod P): a count of the even values so far, the parity of
a dot product. One layer cannot compute it: its aggregate heads sum what the stream holds before
any sub-MLP runs (x, not g(x)). Two layers can: sub-MLPs in the first compute g at every position,
sum heads in the second add it up, and the second layer's sub-MLPs take the residue (periodic
units of period P). Where g is affine (a plain sum, a counter mod k) the first layer adds nothing
and the layout is left alone.
"""
from __future__ import annotations

STEP_LAYOUT = {"n_layers": 2, "n_heads": (0, 0), "n_mlps": (2, 2), "n_agg_heads": (0, 2), "agg_ops": ("sum",)}
LAYOUT_FIELDS = ("n_layers", "n_heads", "n_mlps", "n_recent_heads", "n_agg_heads", "agg_ops")


def step_layout(config, dep, periods: tuple[int, ...]) -> tuple[dict, str]:
    """(DTConfig changes, why) for discover's first architecture when the probe found a running
    sum of a non-affine step and the given config leaves the layout at DTConfig's defaults; the
    step's modulus joins `periods` (discover's periodic units) as the second layer's residue.
    ({}, "") otherwise."""
    from wtc.dt.config import DTConfig

    P = getattr(dep, "step_modulus", None)
    if P is None or dep.step_affine:
        return {}, ""
    default = DTConfig()
    if not all(getattr(config, f) == getattr(default, f) for f in LAYOUT_FIELDS):
        return {}, ""
    changes = dict(STEP_LAYOUT)
    why = "sub-MLPs, then sum heads in a second layer (y_t - y_(t-1)"
    why += f" mod {P}" if P else ""
    why += " is a function of the inputs at t that no sum head reads directly)"
    if P and not config.mlp_periods:
        changes["mlp_periods"] = tuple(sorted(set(periods) | {P}))
    return changes, why
