"""A value a reading writes into a program (a decision, a table entry), as sympy."""
from __future__ import annotations

import sympy as sp


def number(v: float) -> sp.Expr:
    """A whole number as sympy's Integer (printed 2, not 2.0), anything else as a Float."""
    return sp.Integer(int(v)) if float(v).is_integer() else sp.Float(float(v))
