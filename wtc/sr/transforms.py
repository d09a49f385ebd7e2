"""Outer transforms of the target: y = 1/(theta0 + sum theta_j g_j) and y = sqrt(...).

Some simple formulas are linear in library terms only after transforming y: a*b/(a + b) is
1/(1/a + 1/b), sqrt(a^2 + b^2) squared is a^2 + b^2. For z = t(y) the linear machinery fits
z ~ theta0 + sum theta_j g_j by least squares weighted with 1/t'(y)^2 (to first order the same
criterion as least squares on y itself); every candidate is then judged on y.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from wtc.sr.data import Data


@dataclass(frozen=True)
class Transform:
    name: str
    level: int  # operator level whose library it is tried on (its outer operator must be there)
    z: np.ndarray  # (M,) transformed target at the fitting points
    w: np.ndarray  # (M,) least-squares weights (fitting weights included)
    back: Callable  # numpy: prediction of z -> prediction of y
    wrap: Callable  # tree of the linear part -> tree of the formula
    cost: int  # nodes the wrap adds


IDENTITY_COST = 0


def available(data: Data) -> list[Transform]:
    y, w = data.yf, data.wf
    out = []
    amax = float(np.max(np.abs(y)))
    if amax > 0 and (np.all(y > 0) or np.all(y < 0)) and np.min(np.abs(y)) > 1e-2 * amax:
        out.append(Transform("inv", 2, 1.0 / y, w * y**4, lambda z: 1.0 / z,
                             lambda t: ("div", ("1",), t), 2))
    if np.all(y >= 0) and amax > 0:
        floor = (1e-2 * amax) ** 2  # keeps the weights finite where y ~ 0
        out.append(Transform("sqrt", 3, y**2, w / (4 * np.maximum(y**2, floor)),
                             lambda z: np.sqrt(z), lambda t: ("sqrt", t), 1))
    elif np.all(y <= 0) and amax > 0:
        floor = (1e-2 * amax) ** 2
        out.append(Transform("-sqrt", 3, y**2, w / (4 * np.maximum(y**2, floor)),
                             lambda z: -np.sqrt(z), lambda t: ("neg", ("sqrt", t)), 2))
    return out
