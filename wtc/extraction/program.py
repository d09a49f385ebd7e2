"""Program: the extracted algorithm as standalone Python (stdlib math only), built as an AST.

    DOMAIN = {...}            # what it was verified on (wtc.extraction.domain)
    def program(xs, check_domain=True):   # xs: seq_len items (float, or tuple of n_inputs floats)
        ...                   # one list per live variable, filled position by position (a "latest
                              # where" route also carries the value it last saw forward: _last_<name>)
        return out            # seq_len outputs (float, or tuple of n_outputs floats)

Lines are data (Line), expressions are sympy; the source is produced by building a Python AST
(expressions printed by sympy's Python code printer, parsed, checked against a whitelist of node
types and names, and rewritten so that a variable v reads v[t]) and unparsing it. No text from
outside is spliced in.
"""
from __future__ import annotations

import ast
import inspect
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

from wtc.errors import WtcError
from wtc.extraction.domain import Domain, DomainError, domain_statements
from wtc.extraction.conditions import finite_condition
from wtc.extraction.routing_rules import Rule, predicate_text, satisfies
from wtc.extraction.weighted import periodic_source

POSITION = "t"
_ALLOWED_CALLS = {"max", "min", "abs"}
_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Load, ast.Constant,
                  ast.Attribute, ast.IfExp, ast.Compare, ast.BoolOp, ast.operator, ast.unaryop, ast.cmpop,
                  ast.boolop, ast.Tuple)


class ProgramInputError(WtcError, ValueError):
    """A program was called on something that is not a batch of the task's sequences."""


class ProgramDomainError(ProgramInputError):
    """A program was called outside the domain it was read and verified on (Program.domain)."""


class ProgramOutputError(WtcError, ArithmeticError):
    """A program gave a non-finite output (overflow, division by zero) from finite inputs."""


class ProgramDomainWarning(WtcError, UserWarning):
    """A program ran outside its domain, or gave non-finite outputs, under domain="warn"."""


DOMAIN_MODES = ("error", "warn", "ignore")


@dataclass
class Line:
    """One live variable of the program."""

    name: str
    kind: str                        # "route" | "mean" | "sum" | "max" | "min" | "periodic" | "expr"
    source: str | None = None        # route / mean / sum / max / min / periodic: the variable read
    rule: Rule | None = None         # route: how the key is chosen; periodic: {"coefficients": [...]}
    expr: sp.Expr | None = None      # expr: in terms of other variables at the same position
    comment: str = ""


class _PythonPrinter(PythonCodePrinter):
    def _print_Mod(self, expr):     # sympy prints c*Mod(s, 15) as c*s % 15, which Python reads as (c*s) % 15
        return f"({super()._print_Mod(expr)})"


def expression_ast(expr: sp.Expr, variables: set[str]) -> ast.expr:
    """sympy expression -> AST where variable v reads v[t] (t itself stays t)."""
    try:
        code = _PythonPrinter({"fully_qualified_modules": True, "strict": True}).doprint(sp.sympify(expr))
    except Exception as exc:   # sympy refuses functions it cannot print as Python
        raise ValueError(f"unknown name or unsupported function in expression {expr}: {exc}") from exc
    tree = ast.parse(code, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"unsupported construct in expression {expr}: {type(node).__name__}")
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "math"
                                                    and hasattr(math, node.attr) and not node.attr.startswith("_")):
            raise ValueError(f"expression {expr} uses attribute {ast.unparse(node)}")
        if isinstance(node, ast.Name) and node.id not in variables | _ALLOWED_CALLS | {"math", POSITION}:
            raise ValueError(f"expression {expr} uses unknown name {node.id!r}")

    class Index(ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in variables:
                return ast.Subscript(value=ast.Name(node.id, ast.Load()), slice=ast.Name(POSITION, ast.Load()),
                                     ctx=ast.Load())
            return node

    return Index().visit(tree).body


def _stmt(code: str) -> list[ast.stmt]:
    """Parse a statement written in this module (trusted templates only)."""
    return ast.parse(code).body


WINDOW_HELPER = '''
def _window_key(u, t, w, op, pads, ties, end=0):
    """Index of the max/min of u over [t - end - w + 1, t - end] (w None: the whole prefix up to
    t - end); -1 = before the start (value 0), a candidate only when pads is true (or when the
    window holds no position at all). ties: 'first' or 'last' key wins."""
    hi = t - end
    lo = (-1 if pads else 0) if w is None else hi - w + 1
    keys = list(range(max(lo, 0), hi + 1))
    if (pads and lo < 0) or not keys:
        keys = [-1] + keys
    sign = 1.0 if op == "max" else -1.0
    best = None
    for j in keys:
        value = sign * (u[j] if j >= 0 else 0.0)
        if best is None or value > best_value or (ties == "last" and value == best_value):
            best, best_value = j, value
    return best
'''


def _at(var: str, index: str) -> str:
    """Source text for variable `var` at position `index` (the position variable is the index)."""
    return f"({index})" if var == POSITION else f"{var}[{index}]"


def _series(var: str) -> str:
    """Source text for the whole list of a variable."""
    return "list(range(T))" if var == POSITION else var


def _route_stmts(line: Line, condition: str | None = None) -> list[ast.stmt]:
    """The loop statements of a route line; `condition` replaces a "latest where" predicate's text
    (its reading in the key's inputs, wtc.extraction.conditions)."""
    name, src, p = line.name, line.source, line.rule.params
    kind = line.rule.kind
    if kind == "offset":
        d = p["d"]
        fallback = _at(src, "t") if p.get("before", "pad") == "self" else "0.0"
        return _stmt(f"{name}[t] = {_at(src, f't - {d}')} if t >= {d} else {fallback}")
    if kind == "absolute":
        q = p["p"]
        if q == 0:
            return _stmt(f"{name}[t] = {_at(src, '0')}")
        fallback = "0.0" if p["before"] == "pad" else _at(src, "t")
        return _stmt(f"{name}[t] = {_at(src, str(q))} if t >= {q} else {fallback}")
    if kind == "switch":
        table = ", ".join(f"{float(v)!r}: {None if d is None else int(d)}" for v, d in p["table"])
        nothing = "d is not None and " if any(d is None for _, d in p["table"]) else ""
        return _stmt(f"d = {{{table}}}.get({_at(p['var'], 't')}, 0)\n"
                     f"{name}[t] = {_at(src, 't - d')} if {nothing}t >= d else 0.0")
    if kind == "recent":        # a value carried forward: what the latest position satisfying the predicate held
        carried = _carried(name)
        update = f"if {condition or predicate_text(p, _at(p['var'], 't'))}:\n    {carried} = {_at(src, 't')}\n"
        latest = (f"{_at(src, 't - 1')} if t >= 1 else 0.0") if p["strict"] else _at(src, "t")
        read = (f"{name}[t] = {carried}\n" if _carried_start(p) is not None
                else f"{name}[t] = {carried} if {carried} is not None else {latest}\n")
        return _stmt(read + update if p["strict"] else update + read)
    if kind == "compare":       # the latest earlier key comparing so with the query
        start = "t - 1" if p["strict"] else "t"
        return _stmt(f"k = next((j for j in range({start}, -1, -1) if {_at(p['var'], 'j')} {p['op']} "
                     f"{_at(p['query'], 't')}), -1)\n"
                     f"{name}[t] = {_at(src, 'k')} if k >= 0 else 0.0")
    if kind == "window" and p["var"] == src and src != POSITION:   # the extremum itself: max(x[lo:hi])
        return _stmt(f"{name}[t] = {_extremum(src, p)}")
    if kind == "window":
        w = "None" if p["w"] is None else str(int(p["w"]))
        return _stmt(f"k = _window_key({_series(p['var'])}, t, {w}, {p['op']!r}, {not p['real']}, {p['ties']!r}, "
                     f"{int(p.get('end', 0))})\n"
                     f"{name}[t] = {_at(src, 'k')} if k >= 0 else 0.0")
    raise ValueError(f"no code for rule kind {kind!r}")


def _carried(name: str) -> str:
    """The variable a "latest where" line carries forward (0 before any position satisfies it: the
    pads' value). The underscore keeps it apart from line names, which never start with one."""
    return f"_last_{name}"


def _carried_start(p: dict) -> float | None:
    """A "latest where" line's carried value before the first position: the pads' 0 when they
    satisfy the predicate or the rule falls back to a pad; None (nothing found yet) otherwise."""
    return 0.0 if p.get("none", "pad") == "pad" or bool(satisfies(p, np.float64(0.0))) else None


def _extremum(src: str, p: dict) -> str:
    """max/min of src over the rule's window as Python: x[t - end - w + 1 .. t - end], pads (0)
    in it before the start when the rule counts them, 0 where the window holds nothing."""
    end, w, op = int(p.get("end", 0)), p["w"], p["op"]
    hi = {0: "t + 1", 1: "t"}.get(end, f"t - {end - 1}")
    reach = None if w is None else end + int(w) - 1                 # the window starts at t - reach
    seg = f"{src}[:{hi}]" if reach is None else f"{src}[max(t - {reach}, 0):{hi}]"
    if p["real"]:
        return f"{op}({seg})" + (f" if t >= {end} else 0.0" if end else "")
    if reach is None:
        return f"{op}([0.0] + {seg})"
    return f"{op}([0.0] * (t < {reach}) + {seg})"


def _finite_conditions(lines: list[Line], input_names: list[str], domain: Domain | None) -> dict[str, str]:
    """{recency line name: its predicate read in the key's inputs} where the key is an expression
    of input channels with few values (wtc.extraction.conditions)."""
    if domain is None:
        return {}
    values = {n: c.values for n, c in zip(input_names, domain.channels) if c.values is not None}
    exprs = {ln.name: ln.expr for ln in lines if ln.kind == "expr" and ln.expr is not None}
    out = {}
    for ln in lines:
        if ln.kind == "route" and ln.rule.kind == "recent" and ln.rule.params["var"] in exprs:
            text = finite_condition(exprs[ln.rule.params["var"]], ln.rule.params, values, lambda n: _at(n, "t"))
            if text is not None:
                out[ln.name] = text
    return out


def _live(lines: list[Line], outputs: list[sp.Expr], conditions: dict[str, str]) -> list[Line]:
    """lines without the expression lines that only a replaced predicate read (a key read back in
    its inputs leaves its sub-MLP's line unread)."""
    def reads(ln: Line) -> set[str]:
        used = {ln.source} if ln.source else set()
        if ln.rule is not None and "var" in ln.rule.params and ln.name not in conditions:
            used.add(ln.rule.params["var"])
        if ln.rule is not None and "query" in ln.rule.params:
            used.add(ln.rule.params["query"])
        if ln.expr is not None:
            used |= {str(s) for s in ln.expr.free_symbols}
        return used
    kept = list(lines)
    while True:
        used = set().union(*(reads(ln) for ln in kept), *({str(s) for s in sp.sympify(e).free_symbols} for e in outputs))
        drop = [ln for ln in kept if ln.kind == "expr" and ln.name not in used
                and any(lx.rule is not None and lx.rule.params.get("var") == ln.name for lx in lines)]
        if not drop:
            return kept
        kept = [ln for ln in kept if ln not in drop]


def build_source(task_name: str, n_inputs: int, n_outputs: int, input_names: list[str], lines: list[Line],
                 outputs: list[sp.Expr], docstring: str = "", domain: Domain | None = None) -> str:
    """The whole program as Python source; with a domain, `program(xs, check_domain=True)` checks
    its inputs against DOMAIN first."""
    variables = set(input_names) | {ln.name for ln in lines}
    body: list[ast.stmt] = []
    doc = docstring or f"{task_name}: extracted from a Discrete Transformer by wtc."
    if domain is not None:
        doc += ("\n\n    xs outside DOMAIN (the inputs it was verified on) raise ValueError;"
                "\n    program(xs, check_domain=False) runs it anyway.\n    ")
    body.append(ast.Expr(ast.Constant(doc)))
    if domain is not None:
        body += _stmt("if check_domain:\n    _check_domain(xs)")
    body += _stmt("T = len(xs)")
    if n_inputs == 1:
        body += _stmt(f"{input_names[0]} = [float(v) for v in xs]")
    else:
        for i, name in enumerate(input_names):
            body += _stmt(f"{name} = [float(v[{i}]) for v in xs]")
    conditions = _finite_conditions(lines, input_names, domain)
    lines = _live(lines, outputs, conditions)
    for ln in lines:
        body += _stmt(f"{ln.name} = [0.0] * T")
        if ln.kind == "route" and ln.rule.kind == "recent":
            body += _stmt(f"{_carried(ln.name)} = {_carried_start(ln.rule.params)!r}")
    body += _stmt("out = []")
    loop: list[ast.stmt] = []
    for ln in lines:
        if ln.kind == "route":
            loop += _route_stmts(ln, conditions.get(ln.name))
        elif ln.kind == "mean":
            loop += _stmt(f"{ln.name}[t] = sum({_series(ln.source)}[:t + 1]) / (t + 1)")
        elif ln.kind == "sum":
            loop += _stmt(f"{ln.name}[t] = sum({_series(ln.source)}[:t + 1])")
        elif ln.kind in ("max", "min"):
            loop += _stmt(f"{ln.name}[t] = {ln.kind}({_series(ln.source)}[:t + 1])")
        elif ln.kind == "periodic":
            loop += _stmt(periodic_source(ln.name, _series(ln.source), ln.rule.params["coefficients"]))
        elif ln.kind == "expr":
            target = ast.Subscript(value=ast.Name(ln.name, ast.Load()), slice=ast.Name(POSITION, ast.Load()),
                                   ctx=ast.Store())
            loop.append(ast.Assign(targets=[target], value=expression_ast(ln.expr, variables)))
        else:
            raise ValueError(f"unknown line kind {ln.kind!r}")
    outs = [expression_ast(e, variables) for e in outputs]
    if n_outputs > 1:
        outs = [ast.Call(ast.Name("float", ast.Load()), [o], []) for o in outs]
    value = outs[0] if n_outputs == 1 else ast.Tuple(elts=outs, ctx=ast.Load())
    if n_outputs == 1:
        value = ast.Call(ast.Name("float", ast.Load()), [value], [])
    loop.append(ast.Expr(ast.Call(func=ast.Attribute(ast.Name("out", ast.Load()), "append", ast.Load()),
                                  args=[value], keywords=[])))
    body.append(ast.For(target=ast.Name(POSITION, ast.Store()),
                        iter=ast.Call(ast.Name("range", ast.Load()), [ast.Name("T", ast.Load())], []),
                        body=loop, orelse=[]))
    body += _stmt("return out")
    args = [ast.arg("xs")] + ([ast.arg("check_domain")] if domain is not None else [])
    defaults = [ast.Constant(True)] if domain is not None else []
    func = ast.FunctionDef(name="program", args=ast.arguments(posonlyargs=[], args=args, vararg=None,
                                                              kwonlyargs=[], kw_defaults=[], kwarg=None,
                                                              defaults=defaults),
                           body=body, decorator_list=[], returns=None, type_params=[])
    module = [*_stmt("import math")]
    if domain is not None:
        if domain.n_inputs != n_inputs:
            raise ValueError(f"the domain has {domain.n_inputs} channel(s), the program {n_inputs} input(s)")
        module += domain_statements(domain)
    if any(ln.kind == "route" and ln.rule.kind == "window" and (ln.rule.params["var"] != ln.source or ln.source == POSITION)
           for ln in lines):
        module += ast.parse(WINDOW_HELPER).body
    module.append(func)
    tree = ast.fix_missing_locations(ast.Module(body=module, type_ignores=[]))
    return ast.unparse(tree) + "\n"


@dataclass
class Program:
    """An extracted program: `source` defines `def program(xs)`; calling the object runs it on a
    batch (array (n, T[, n_inputs]) in, array (n, T[, n_outputs]) out).

    `domain` (wtc.extraction.domain.Domain): the inputs it was read and verified on, recorded at
    extraction and written into the source as DOMAIN (a Program built from such a source reads it
    back); None for programs saved before domains were recorded."""

    task: str
    source: str
    seq_len: int
    n_inputs: int
    n_outputs: int
    lines: list[Line] = field(default_factory=list)
    outputs: list[sp.Expr] = field(default_factory=list)
    ok: bool = True
    failures: list[str] = field(default_factory=list)   # which module broke, and why
    readings: list = field(default_factory=list)        # per-module evidence (wtc.extraction.reader)
    model: object = field(default=None, repr=False)     # the model it was read from, if any
    domain: Domain | None = None

    def __post_init__(self) -> None:
        namespace: dict = {}
        exec(compile(self.source, f"<wtc program {self.task}>", "exec"), namespace)  # noqa: S102 - our own AST
        self._fn = namespace["program"]
        if namespace.get("DOMAIN") is not None:   # the source is the record: one domain, not two
            written = Domain.from_dict(namespace["DOMAIN"])
            if self.domain is not None and self.domain != written:
                raise DomainError(f"program for {self.task!r}: domain= differs from the DOMAIN its source records")
            self.domain = written
        if self.domain is not None and self.domain.n_inputs != self.n_inputs:
            raise DomainError(f"program for {self.task!r}: its domain has {self.domain.n_inputs} channel(s), "
                              f"the program {self.n_inputs} input(s)")
        # Program checks the domain itself (vectorised, and under its switch): the source's own check off
        self._unchecked = {"check_domain": False} if "check_domain" in inspect.signature(self._fn).parameters else {}

    def run(self, xs: list) -> list:
        """One sequence, as the source defines it (its domain check included)."""
        return self._fn(xs)

    def __call__(self, x, *, domain: str = "error") -> np.ndarray:
        """Run on a batch (n, T[, n_inputs]).

        domain: what to do with inputs outside `self.domain` (values or a length it was not
        verified on) and with non-finite outputs from finite inputs (an overflow, a division by
        zero): "error" (default) raises ProgramDomainError / ProgramOutputError naming the first
        one (sequence, position, channel, value, the domain); "warn" issues one
        ProgramDomainWarning for each and computes; "ignore" computes silently. A wrong channel
        count, NaN / inf or text inputs are errors under every setting."""
        from wtc.arguments import real_array
        from wtc.tasks.limits import plain_numbers

        if domain not in DOMAIN_MODES:
            raise ProgramInputError(f"domain= must be one of {', '.join(map(repr, DOMAIN_MODES))}, got {domain!r}")
        x = plain_numbers(x, f"the input of the program for {self.task!r}", ProgramInputError)   # no text ('nan')
        x = real_array(x, f"the input of the program for {self.task!r}", ProgramInputError)
        if x.ndim == 2 and self.n_inputs == 1:
            x = x[:, :, None]
        if x.ndim != 3 or x.shape[2] != self.n_inputs or x.shape[1] < 1:   # any length: the source loops over T
            raise ProgramInputError(f"program for {self.task!r} takes (n, T, {self.n_inputs}) inputs (read at "
                                    f"T = {self.seq_len}), got {x.shape}")
        if not np.all(np.isfinite(x)):      # as model.predict: a program of NaNs would read as an answer
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
            raise ProgramInputError(f"the input of the program for {self.task!r} holds {x[bad]} at index {bad}; "
                                    "programs take finite numbers")
        if x.shape[0] == 0:                 # the shape a non-empty batch has, with no rows
            return np.zeros((0, x.shape[1]) + ((self.n_outputs,) if self.n_outputs > 1 else ()))
        outside = self.domain.violation(x) if self.domain is not None and domain != "ignore" else None
        if outside is not None:
            self._complain(domain, ProgramDomainError, f"the input of the program for {self.task!r} is outside the "
                           f"domain it was verified on: {outside.message}")
        rows = []
        for seq in x:
            xs = seq[:, 0].tolist() if self.n_inputs == 1 else [tuple(r) for r in seq.tolist()]
            rows.append(self._fn(xs, **self._unchecked))
        out = np.asarray(rows, dtype=np.float64)
        if domain != "ignore" and not np.all(np.isfinite(out)):
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(out))[0])
            self._complain(domain, ProgramOutputError, f"the program for {self.task!r} gave {out[bad]} at index "
                           f"{bad} (sequence, position[, output]) from finite inputs")
        return out

    @staticmethod
    def _complain(mode: str, error: type, message: str) -> None:
        if mode == "error":
            raise error(f"{message}; program(x, domain='warn') or domain='ignore' computes anyway")
        warnings.warn(message, ProgramDomainWarning, stacklevel=3)

    @property
    def n_lines(self) -> int:
        """Lines of the function body (the readable size of the program)."""
        return len([ln for ln in self.source.splitlines() if ln.strip()])

    def __str__(self) -> str:
        return self.source
