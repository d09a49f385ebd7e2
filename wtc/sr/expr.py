"""Expression trees: the operator table, numpy evaluation, node count and sympy conversion.

A tree is a nested tuple, cheap to hash and to build by the hundred thousand:
  ("x", i)            input variable i
  ("1",)              the constant one (a structural leaf used by the enumeration)
  ("c", j)            free parameter j, value taken from the ``params`` vector at evaluation
  ("k", num)          a fixed constant, ``num`` a :class:`wtc.sr.numbers.Num`
  (op, child)         unary operator
  (op, left, right)   binary operator
Complexity is the number of nodes of the tree (PySR's convention).
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Sequence

import numpy as np
import sympy as sp
from wtc.errors import SRError


@dataclass(frozen=True)
class Op:
    name: str
    arity: int
    fn: Callable  # numpy, elementwise, broadcasting
    sym: Callable  # sympy builder
    level: int  # operator sets are widened level by level (1, 2, 3; INT for integer data)
    commutative: bool = False
    nonlinear: bool = False  # a constant inside its argument changes the function class
    rhs: str = "any"  # integer operators: "const" takes only a small integer constant on the
    # right (x % 3, x // 2), "both" any term or such a constant (a >= b, a + b + c >= 2)


# ---------------------------------------------------------------------------------- integer ops
# Printed as plain Python: x % 3 (sympy's Mod), x // 3 and indicators (a >= b), (a == b) that
# are 1 or 0. Each printer (str, Python source, numpy for lambdify) has its own method, so the
# formula text, wtc's extracted programs and Fit.predict agree.
def _paren(printer, arg, prec):
    from sympy.printing.precedence import precedence
    text = printer._print(arg)
    return f"({text})" if precedence(arg) < prec else text


class FloorDiv(sp.Function):
    """a // b (floor division, Python semantics: rounds towards -inf)."""
    nargs = 2
    precedence = 50  # sympy's PRECEDENCE["Mul"]: parenthesised inside powers, not inside sums

    @classmethod
    def eval(cls, a, b):
        if a.is_Number and b.is_Number and b != 0:
            return sp.floor(a / b)
        return None

    def _sympystr(self, printer):
        a, b = self.args
        return f"{_paren(printer, a, 50)} // {_paren(printer, b, 51)}"

    def _pythoncode(self, printer):
        a, b = self.args
        return f"({printer._print(a)} // {printer._print(b)})"

    _lambdacode = _pythoncode

    def _numpycode(self, printer):
        a, b = self.args
        return f"{printer._module_format('numpy.floor_divide')}({printer._print(a)}, {printer._print(b)})"


class _Indicator(sp.Function):
    """1 when the comparison holds, else 0 (Iverson bracket); printed (a >= b)."""
    nargs = 2
    _op = ""
    _np = ""
    _py: Callable = None  # type: ignore[assignment]

    @classmethod
    def eval(cls, a, b):
        if a.is_Number and b.is_Number:
            return sp.Integer(1) if cls._py(float(a), float(b)) else sp.Integer(0)
        return None

    def _sympystr(self, printer):
        a, b = self.args
        return f"({printer._print(a)} {self._op} {printer._print(b)})"

    def _pythoncode(self, printer):
        a, b = self.args
        return f"(1 if {printer._print(a)} {self._op} {printer._print(b)} else 0)"

    _lambdacode = _pythoncode

    def _numpycode(self, printer):
        a, b = self.args
        return f"(1.0*{printer._module_format('numpy.' + self._np)}({printer._print(a)}, {printer._print(b)}))"


class Ge(_Indicator):
    """(a >= b): 1 or 0."""
    _op, _np = ">=", "greater_equal"
    _py = staticmethod(lambda a, b: a >= b)


class Eq(_Indicator):
    """(a == b): 1 or 0."""
    _op, _np = "==", "equal"
    _py = staticmethod(lambda a, b: a == b)


class In(sp.Function):
    """(a in {v1, v2, ...}): 1 or 0 — a detector read off a table (x in {2, 3, 5, 7}); the values
    are the arguments after the first."""

    @classmethod
    def eval(cls, a, *values):
        if a.is_Number and all(v.is_Number for v in values):
            return sp.Integer(1) if any(a == v for v in values) else sp.Integer(0)
        return None

    def _values(self, printer):
        return ", ".join(printer._print(v) for v in self.args[1:])

    def _sympystr(self, printer):
        return f"({printer._print(self.args[0])} in {{{self._values(printer)}}})"

    def _pythoncode(self, printer):
        return f"(1 if {printer._print(self.args[0])} in ({self._values(printer)},) else 0)"

    _lambdacode = _pythoncode

    def _numpycode(self, printer):
        return (f"(1.0*{printer._module_format('numpy.isin')}({printer._print(self.args[0])}, "
                f"[{self._values(printer)}]))")


def _in(a, values):
    return np.isin(a, values).astype(np.float64)


def _ge(a, b):
    return np.greater_equal(a, b).astype(np.float64)


def _eq(a, b):
    return np.equal(a, b).astype(np.float64)


INT = 10  # the level of the integer operators: used on integer data only (search.op_levels)
INT_COMPANIONS = ("max", "min", "abs")  # tried with them: chained min/max, |a - b| on integers


def _relu_sym(a):
    return sp.Max(a, 0)


OPS: dict[str, Op] = {o.name: o for o in [
    Op("add", 2, np.add, lambda a, b: a + b, 1, commutative=True),
    Op("sub", 2, np.subtract, lambda a, b: a - b, 1),
    Op("mul", 2, np.multiply, lambda a, b: a * b, 1, commutative=True),
    Op("sq", 1, np.square, lambda a: a**2, 1),
    Op("div", 2, np.divide, lambda a, b: a / b, 2, nonlinear=True),
    Op("max", 2, np.maximum, sp.Max, 2, commutative=True, nonlinear=True),
    Op("min", 2, np.minimum, sp.Min, 2, commutative=True, nonlinear=True),
    Op("abs", 1, np.abs, sp.Abs, 2, nonlinear=True),
    Op("relu", 1, lambda a: np.maximum(a, 0.0), _relu_sym, 2, nonlinear=True),
    Op("neg", 1, np.negative, lambda a: -a, 3),
    Op("sqrt", 1, np.sqrt, sp.sqrt, 3, nonlinear=True),
    Op("exp", 1, np.exp, sp.exp, 3, nonlinear=True),
    Op("log", 1, np.log, sp.log, 3, nonlinear=True),
    Op("sin", 1, np.sin, sp.sin, 3, nonlinear=True),
    Op("cos", 1, np.cos, sp.cos, 3, nonlinear=True),
    Op("tanh", 1, np.tanh, sp.tanh, 3, nonlinear=True),
    # comparisons first: of two forms equal on the data the first generated is kept, and a 0/1
    # target reads better as (a + b + c >= 2) than as (a + b + c) // 2
    Op("ge", 2, _ge, Ge, INT, rhs="both"),
    Op("eq", 2, _eq, Eq, INT, commutative=True, rhs="both"),
    Op("mod", 2, np.mod, sp.Mod, INT, rhs="const"),
    Op("floordiv", 2, np.floor_divide, FloorDiv, INT, rhs="const"),
    # a in {values}: the right operand a ("set", values) leaf; only created by the table pass
    Op("in", 2, _in, lambda a, values: In(a, *values), 99),
    # x ** c with a fitted exponent; only created by the inner-constant pass (never enumerated)
    Op("pow", 2, np.power, lambda a, b: a**b, 99, nonlinear=True),
]}

# Friendly aliases accepted in user operator lists.
ALIASES = {"+": "add", "-": "sub", "*": "mul", "/": "div", "square": "sq", "maximum": "max",
           "minimum": "min", "negate": "neg", "^": "pow", "**": "pow", "%": "mod", "//": "floordiv",
           ">=": "ge", "==": "eq", "step": "ge"}

LEVELS = (1, 2, 3)


def level_ops(level: int) -> tuple[str, ...]:
    """All enumerable operators up to ``level`` (cumulative); INT: level 1, the integer operators
    and their companions."""
    if level == INT:
        return (*level_ops(1), *INT_COMPANIONS, *(n for n, o in OPS.items() if o.level == INT))
    return tuple(n for n, o in OPS.items() if o.level <= level)


def resolve_ops(names: Sequence[str]) -> tuple[str, ...]:
    out = []
    for n in names:
        key = ALIASES.get(str(n).lower(), str(n).lower())
        if key not in OPS:
            raise SRError(f"unknown operator {n!r}; known: {sorted(OPS)} (aliases {sorted(ALIASES)})")
        out.append(key)
    return tuple(dict.fromkeys(out))


# ---------------------------------------------------------------------------------- evaluation
def evaluate(tree, cols: Sequence[np.ndarray], params=None, memo: dict | None = None) -> np.ndarray:
    """Evaluate ``tree`` on input columns ``cols`` (each shape (m,)); params broadcast, e.g. (G, 1)
    gives (G, m). Invalid operations yield nan/inf (warnings silenced); callers check finiteness."""
    if memo is None:
        memo = {}
    with np.errstate(all="ignore"):
        return _eval(tree, cols, params, memo)


def _eval(t, cols, params, memo):
    head = t[0]
    if head == "x":
        return cols[t[1]]
    if head == "1":
        return np.ones_like(cols[0])
    if head == "c":
        return params[t[1]]
    if head == "k":
        return np.float64(t[1].value)
    if head == "set":
        return np.asarray(t[1], dtype=np.float64)
    hit = memo.get(t)
    if hit is not None:
        return hit
    op = OPS[head]
    args = [_eval(ch, cols, params, memo) for ch in t[1:]]
    val = op.fn(*args)
    if not has_params(t):  # parameter-free subtrees are reusable across calls sharing memo
        memo[t] = val
    return val


_HAS_PARAMS: dict = {}


def has_params(t) -> bool:
    hit = _HAS_PARAMS.get(t)
    if hit is None:
        hit = t[0] == "c" or (t[0] in OPS and any(has_params(ch) for ch in t[1:]))
        if len(_HAS_PARAMS) > 500_000:
            _HAS_PARAMS.clear()
        _HAS_PARAMS[t] = hit
    return hit


def size(t) -> int:
    """Node count (= complexity)."""
    if t[0] in OPS:
        return 1 + sum(size(ch) for ch in t[1:])
    return len(t[1]) if t[0] == "set" else 1      # a set counts its values


def n_params(t) -> int:
    if t[0] == "c":
        return 1
    if t[0] in OPS:
        return sum(n_params(ch) for ch in t[1:])
    return 0


def const_cost(t) -> float:
    """Sum of the description costs of the fixed constants in ``t`` (tie-breaker)."""
    if t[0] == "k":
        return t[1].cost
    if t[0] in OPS:
        return sum(const_cost(ch) for ch in t[1:])
    return 0.0


def substitute(t, values: dict):
    """Replace parameter leaves ("c", j) by fixed constants ("k", values[j]) where given."""
    if t[0] == "c":
        return ("k", values[t[1]]) if t[1] in values else t
    if t[0] in OPS:
        return (t[0], *(substitute(ch, values) for ch in t[1:]))
    return t


def renumber(t, start: int = 0):
    """Renumber parameter leaves 0..p-1 in depth-first order; returns (tree, p)."""
    counter = [start]

    def go(u):
        if u[0] == "c":
            counter[0] += 1
            return ("c", counter[0] - 1)
        if u[0] in OPS:
            return (u[0], *(go(ch) for ch in u[1:]))
        return u
    out = go(t)
    return out, counter[0] - start


def uses_integer_ops(t) -> bool:
    if t[0] in OPS:
        return OPS[t[0]].level == INT or t[0] == "in" or any(uses_integer_ops(ch) for ch in t[1:])
    return False


# ---------------------------------------------------------------------------------- printing
def to_sympy(t, symbols: Sequence[sp.Symbol], params=None):
    head = t[0]
    if head == "x":
        return symbols[t[1]]
    if head == "1":
        return sp.Integer(1)
    if head == "c":
        return sp.Float(params[t[1]]) if params is not None else sp.Symbol(f"c{t[1]}")
    if head == "k":
        return t[1].sym
    if head == "set":
        return tuple(sp.Integer(int(v)) if float(v).is_integer() else sp.nsimplify(v) for v in t[1])
    return OPS[head].sym(*(to_sympy(ch, symbols, params) for ch in t[1:]))


def to_str(t, names: Sequence[str]) -> str:
    """Compact infix rendering straight from the tree (no simplification)."""
    head = t[0]
    if head == "x":
        return names[t[1]]
    if head == "1":
        return "1"
    if head == "c":
        return f"c{t[1]}"
    if head == "k":
        return t[1].text
    if head == "set":
        return "{" + ", ".join(f"{v:g}" for v in t[1]) + "}"
    args = [to_str(ch, names) for ch in t[1:]]
    infix = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "mod": "%", "floordiv": "//",
             "ge": ">=", "eq": "==", "in": "in"}
    if head in infix:
        return f"({args[0]} {infix[head]} {args[1]})"
    if head == "sq":
        return f"({args[0]})**2"
    if head == "neg":
        return f"-({args[0]})"
    return f"{head}({', '.join(args)})"
