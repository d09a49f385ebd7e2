"""A formula as a torch module (PySR's ``pytorch()``): forward on X (n, d) gives the formula's
values (n,), as ``predict`` does, in X's dtype.

The sympy expression is walked at every forward (formulas have tens of nodes, so the walk is cheap
next to the tensor work) and the module pickles with it. Non-integer constants are parameters
(float64, cast to X's dtype in forward) that can be fine-tuned by gradient descent; integers,
exponents and pi/e stay fixed. Imported only by ``SymbolicRegressor.pytorch()``: torch loads there.
"""
from __future__ import annotations

import sympy as sp
import torch
from torch import nn

from wtc.errors import SRError
from wtc.sr.expr import Eq, FloorDiv, Ge, In

_UNARY = {sp.sin: torch.sin, sp.cos: torch.cos, sp.tan: torch.tan, sp.tanh: torch.tanh, sp.exp: torch.exp,
          sp.log: torch.log, sp.Abs: torch.abs, sp.floor: torch.floor, sp.ceiling: torch.ceil,
          sp.sign: torch.sign, sp.sinh: torch.sinh, sp.cosh: torch.cosh, sp.asin: torch.asin,
          sp.acos: torch.acos, sp.atan: torch.atan}
_RELATIONAL = {sp.GreaterThan: torch.ge, sp.StrictGreaterThan: torch.gt, sp.LessThan: torch.le,
               sp.StrictLessThan: torch.lt, sp.Equality: torch.eq, sp.Unequality: torch.ne}
_INDICATORS = {Ge: torch.ge, Eq: torch.eq}


_FUNCTIONS = (*_UNARY, sp.Max, sp.Min, sp.Mod, FloorDiv, In, *_INDICATORS, sp.Piecewise)


def _check(e, names) -> None:
    """Refuse, before any forward, what the walk cannot compute (naming it)."""
    for node in sp.preorder_traversal(e):
        if node.is_Symbol and node.name not in names:
            raise SRError(f"the formula uses {node.name!r}, which is not one of the inputs {list(names)}")
        if node.is_Atom:
            continue
        known = node.func in _FUNCTIONS or type(node) in _RELATIONAL
        if (node.is_Function or isinstance(node, sp.logic.boolalg.Boolean)) and not known:
            raise SRError(f"pytorch(): no torch form for {node.func.__name__} in {e}")


def _constants(e, out: list) -> list:
    """The non-integer numbers of e that become parameters (not exponents, not a set's values)."""
    if e.is_Number:
        if not e.is_Integer and e.is_finite is not False and e not in out:
            out.append(e)
    elif e.is_Pow:
        _constants(e.args[0], out)
        if not e.args[1].is_Number:
            _constants(e.args[1], out)
    elif e.func is In:
        _constants(e.args[0], out)
    else:
        for a in e.args:
            _constants(a, out)
    return out


class SymbolicModule(nn.Module):
    """forward(X (n, d)) -> (n,): the formula ``expr`` over the columns named ``names``."""

    def __init__(self, expr: sp.Expr, names):
        super().__init__()
        self.names = tuple(names)
        _check(expr, self.names)
        self.expr = expr
        constants = _constants(expr, [])
        self._slot = {c: i for i, c in enumerate(constants)}
        self.constants = nn.Parameter(torch.tensor([float(c) for c in constants], dtype=torch.float64))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """The formula's values (n,) on X (n, d), in X's dtype and on X's device."""
        if X.ndim != 2 or X.shape[1] != len(self.names):
            raise SRError(f"X must have shape (n, {len(self.names)}) (columns {list(self.names)}), "
                          f"got {tuple(X.shape)}")
        cols = {s: X[:, i] for i, s in enumerate(self.names)}
        consts = self.constants.to(device=X.device, dtype=X.dtype)   # differentiable: grads reach the parameters
        return self._eval(self.expr, cols, consts, X).expand(X.shape[0])

    def _eval(self, e, cols, consts, X):
        ev = lambda a: self._eval(a, cols, consts, X)  # noqa: E731
        if e.is_Symbol:
            return cols[e.name]
        if e in self._slot:
            return consts[self._slot[e]]
        if e.is_Number or e.is_NumberSymbol:
            return torch.tensor(float(e), dtype=X.dtype, device=X.device)
        if e.is_Add:
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = out + ev(a)
            return out
        if e.is_Mul:
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = out * ev(a)
            return out
        if e.is_Pow:
            base, p = e.args
            if p == sp.Rational(1, 2):
                return torch.sqrt(ev(base))
            if p == -1:
                return 1.0 / ev(base)
            if p.is_Integer:
                return ev(base) ** int(p)
            if p.is_Number:
                return ev(base) ** float(p)
            return ev(base) ** ev(p)
        if e.func in _UNARY:
            return _UNARY[e.func](ev(e.args[0]))
        if e.func in (sp.Max, sp.Min):
            op = torch.maximum if e.func is sp.Max else torch.minimum
            vals = [ev(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = op(*torch.broadcast_tensors(out, v))
            return out
        if e.func is sp.Mod:
            return torch.remainder(ev(e.args[0]), ev(e.args[1]))
        if e.func is FloorDiv:
            return torch.div(ev(e.args[0]), ev(e.args[1]), rounding_mode="floor")
        if e.func in _INDICATORS:
            return _INDICATORS[e.func](ev(e.args[0]), ev(e.args[1])).to(X.dtype)
        if e.func is In:
            values = torch.tensor([float(v) for v in e.args[1:]], dtype=X.dtype, device=X.device)
            return torch.isin(ev(e.args[0]), values).to(X.dtype)
        if type(e) in _RELATIONAL:
            return _RELATIONAL[type(e)](ev(e.args[0]), ev(e.args[1])).to(X.dtype)
        if isinstance(e, sp.Piecewise):
            out = torch.full((X.shape[0],), float("nan"), dtype=X.dtype, device=X.device)
            for value, cond in reversed(e.args):    # the first true condition wins
                hit = torch.ones(X.shape[0], dtype=torch.bool, device=X.device) if cond is sp.true \
                    else ev(cond).to(torch.bool)
                out = torch.where(hit, ev(value), out)
            return out
        raise SRError(f"pytorch(): no torch form for {e.func.__name__} in {self.expr}")

    def extra_repr(self) -> str:
        return f"{self.expr}  [inputs {', '.join(self.names)}]"


def to_torch(expr: sp.Expr, names) -> SymbolicModule:
    """The formula ``expr`` over the inputs ``names`` (X's columns, in order) as a torch module."""
    return SymbolicModule(expr, names)
