"""Sandbox for untrusted predicate source (from an LLM or a shell-command proposer).

A predicate is Python source defining exactly one function, and nothing else but a docstring:

    def predicate(tokens, pos):      # tokens: list[str]; pos: int index into tokens
        return tokens[pos] == '('    # must return a bool

  check_source(source)      AST whitelist check; PredicateRejected names the first reason
  compile_predicate(source) checked source -> in-process callable, NO time limit (trusted use)
  evaluate(source, contexts, positions=None, timeout_s=5.0)
                            runs it in a separate process with a wall-clock and memory limit

What the whitelist allows: one top-level `def predicate(tokens, pos)` (annotations ok; no
defaults, *args, **kwargs or decorators), statements Assign/AugAssign/If/For/Break/Continue/
Pass/Return/Expr, ordinary expressions, comprehensions, subscripts and slices. Names are locals,
`predicate` itself (recursion stops at Python's recursion limit) or SAFE_BUILTINS; no name or
attribute may start with an underscore (bar the throwaway `_`); attributes are SAFE_METHODS only;
a call's target is a name or such a method. Everything else is rejected: imports, while loops
(`for` is bounded by its iterable; `range(10**12)` is left to the timeout), lambda, nested or
async functions, classes, with/try/raise/assert/del/global/nonlocal, walrus, starred and
f-strings (not needed; `str.format` is left out because its fields reach attributes). Top-level
constant assignments are rejected too: the module holds the function and an optional docstring.
"""
from __future__ import annotations

from wtc.errors import WtcError

import ast
import builtins
import math
import multiprocessing as mp
import os
from collections.abc import Callable, Sequence

import numpy as np
from wtc.errors import ArgumentError, ArgumentTypeError

Predicate = Callable[[list[str], int], bool]

MAX_SOURCE_CHARS = 4000
MAX_AST_NODES = 2000
SAFE_BUILTINS = frozenset({
    "len", "range", "min", "max", "any", "all", "abs", "sum", "sorted", "set", "frozenset", "list",
    "tuple", "dict", "str", "int", "float", "bool", "enumerate", "zip", "reversed", "map", "filter",
    "ord", "chr", "divmod", "round"})
# str/list/set/dict methods without side effects outside their object; `index` is left out
# because it raises where `find` or `in` does not, `format` because "{0.__class__}" reaches dunders.
SAFE_METHODS = frozenset({
    "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "istitle", "isidentifier",
    "isnumeric", "isdecimal", "isprintable", "isascii", "startswith", "endswith", "strip",
    "lstrip", "rstrip", "lower", "upper", "count", "find", "rfind", "split", "rsplit", "join",
    "replace", "append", "pop", "add", "get", "keys", "values", "items"})
_A = ast
_ALLOWED_NODES = (
    _A.Module, _A.FunctionDef, _A.arguments, _A.arg, _A.Return, _A.Assign, _A.AugAssign, _A.If,
    _A.For, _A.Break, _A.Continue, _A.Pass, _A.Expr, _A.BoolOp, _A.And, _A.Or, _A.BinOp, _A.Add,
    _A.Sub, _A.Mult, _A.Div, _A.FloorDiv, _A.Mod, _A.Pow, _A.LShift, _A.RShift, _A.BitOr,
    _A.BitXor, _A.BitAnd, _A.UnaryOp, _A.Not, _A.USub, _A.UAdd, _A.Invert, _A.Compare, _A.Eq,
    _A.NotEq, _A.Lt, _A.LtE, _A.Gt, _A.GtE, _A.In, _A.NotIn, _A.Is, _A.IsNot, _A.IfExp, _A.Call,
    _A.keyword, _A.Constant, _A.Name, _A.Attribute, _A.Subscript, _A.Slice, _A.List, _A.Tuple,
    _A.Set, _A.Dict, _A.ListComp, _A.SetComp, _A.DictComp, _A.GeneratorExp, _A.comprehension,
    _A.Load, _A.Store)
_NODE_WORDS = {  # node type -> its words in "... is/are not allowed"
    "Import": "import is", "ImportFrom": "import is", "While": "while loops are",
    "Lambda": "lambda is", "ClassDef": "class definitions are", "AsyncFunctionDef":
    "async functions are", "With": "with statements are", "AsyncWith": "with statements are",
    "AsyncFor": "async for loops are", "Try": "try statements are", "TryStar": "try statements are",
    "Raise": "raise is", "Assert": "assert is", "Delete": "del is", "Del": "del is",
    "Global": "global is", "Nonlocal": "nonlocal is", "Await": "await is", "Yield": "yield is",
    "YieldFrom": "yield is", "NamedExpr": "the walrus operator is", "Starred":
    "starred expressions are", "JoinedStr": "f-strings are", "FormattedValue": "f-strings are",
    "Match": "match statements are", "AnnAssign": "annotated assignments are"}
_SIGNATURE = "must define exactly one function `predicate(tokens, pos)`"


MAX_TIMEOUT_S = 3600.0


class PredicateRejected(WtcError, ValueError):
    """Predicate source that may not run, or that failed when run; the message says why."""


def _reject(node: ast.AST | None, what: str) -> PredicateRejected:
    line = getattr(node, "lineno", None)
    return PredicateRejected(f"line {line}: {what}" if line else what)


def _check_structure(tree: ast.Module) -> ast.FunctionDef:
    body = list(tree.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]                                    # module docstring
    funcs = [s for s in body if isinstance(s, ast.FunctionDef)]
    if not funcs:
        raise PredicateRejected(f"{_SIGNATURE}; found none")
    if len(body) != 1:
        extra = next(s for s in body if s is not funcs[0])
        raise _reject(extra, f"{_SIGNATURE} and nothing else at top level "
                             f"(found {type(extra).__name__})")
    f = funcs[0]
    a = f.args
    if f.name != "predicate":
        raise _reject(f, f"{_SIGNATURE}; found `{f.name}`")
    if [x.arg for x in a.args] != ["tokens", "pos"] or a.posonlyargs or a.vararg or a.kwonlyargs \
            or a.kwarg or a.defaults:
        raise _reject(f, f"{_SIGNATURE}; found `{f.name}({ast.unparse(a)})`")
    if f.decorator_list:
        raise _reject(f, "decorators are not allowed")
    return f


def _check_and_compile(source: str) -> tuple[ast.Module, object]:
    if not isinstance(source, str):
        raise ArgumentTypeError(f"predicate source must be a str, got {type(source).__name__}")
    if len(source) > MAX_SOURCE_CHARS:
        raise PredicateRejected(f"source is {len(source)} characters, over the limit of "
                                f"{MAX_SOURCE_CHARS}")
    try:
        tree = ast.parse(source, "<predicate>")
    except SyntaxError as e:
        where = f" at line {e.lineno}" if e.lineno else ""
        raise PredicateRejected(f"syntax error{where}: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise PredicateRejected(f"cannot parse: {type(e).__name__}: {e}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_AST_NODES:
        raise PredicateRejected(f"source has {len(nodes)} AST nodes, over the limit of "
                                f"{MAX_AST_NODES}")
    top = {id(s) for s in tree.body}
    bound = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {n.arg for n in nodes if isinstance(n, ast.arg)} | {"predicate"}
    for node in nodes:  # node types first: "lambda is not allowed" says more than its call
        if not isinstance(node, _ALLOWED_NODES):
            kind = type(node).__name__
            raise _reject(node, f"{_NODE_WORDS.get(kind, kind + ' is')} not allowed")
    for node in nodes:
        if isinstance(node, ast.FunctionDef) and id(node) not in top:
            raise _reject(node, "nested function definitions are not allowed")
        if isinstance(node, ast.Name):
            if (node.id.startswith("_") and node.id != "_") or \
                    (node.id not in bound and node.id not in SAFE_BUILTINS):
                raise _reject(node, f"name '{node.id}' is not allowed")
        elif isinstance(node, ast.Attribute):
            if node.attr not in SAFE_METHODS or not isinstance(node.ctx, ast.Load):
                raise _reject(node, f"attribute '{node.attr}' is not allowed")
        elif isinstance(node, ast.Call) and not isinstance(node.func, (ast.Name, ast.Attribute)):
            raise _reject(node, "only names and allowed methods may be called")
        elif isinstance(node, ast.keyword) and (node.arg is None or node.arg.startswith("_")):
            raise _reject(node, "** and underscore keyword arguments are not allowed")
    _check_structure(tree)
    try:  # some errors (e.g. 'break' outside loop) only show when compiling
        code = compile(tree, "<predicate>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise PredicateRejected(f"cannot compile: {type(e).__name__}: {e}") from None
    return tree, code


def check_source(source: str) -> ast.Module:
    """Parse and whitelist-check predicate source; return its AST or raise PredicateRejected."""
    return _check_and_compile(source)[0]


def compile_predicate(source: str) -> Predicate:
    """Checked source -> the `predicate` function, with only SAFE_BUILTINS as builtins.

    The callable runs in this process with NO time or memory limit (a checked predicate can still
    loop over range(10**12)): use it for trusted or already-evaluated code; run untrusted code
    through `evaluate`."""
    _, code = _check_and_compile(source)
    namespace = {"__builtins__": {k: getattr(builtins, k) for k in SAFE_BUILTINS},
                 "__name__": "wtc_predicate"}
    # Only defines the function: the check forbids defaults, decorators and other statements.
    exec(code, namespace)  # noqa: S102 - checked source
    return namespace["predicate"]


def _limit_resources(memory_bytes: int, cpu_s: int) -> None:
    """In the child: address space = what the fork inherited + memory_bytes (a fork of a process
    holding torch already maps GBs, so a flat 1 GiB would starve it); CPU time as a backstop for
    when the parent dies and cannot kill us. Linux only; elsewhere the wall clock is the limit."""
    try:
        import resource
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return
    for res, soft in ((resource.RLIMIT_AS, vm + memory_bytes), (resource.RLIMIT_CPU, cpu_s)):
        hard = resource.getrlimit(res)[1]
        resource.setrlimit(res, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def _run_child(source, contexts, positions, conn, memory_bytes, cpu_s) -> None:
    """Child process: evaluate and send b"o" + bool bytes, or b"r" + the reason in UTF-8 (plain
    bytes, so the parent never unpickles what came from the sandbox)."""
    def reject(reason: str) -> None:
        conn.send_bytes(b"r" + reason.encode("utf-8", "replace"))

    try:
        _limit_resources(memory_bytes, cpu_s)
        pred = compile_predicate(source)
        work = [list(c) for c in contexts]   # the predicate may mutate its list: detected below
        if positions is None:
            pairs = ((ci, p) for ci, c in enumerate(contexts) for p in range(len(c)))
            n = sum(len(c) for c in contexts)
        else:
            pairs, n = (tuple(x) for x in positions.tolist()), len(positions)
        out = np.empty(n, dtype=bool)
        for k, (ci, p) in enumerate(pairs):
            try:
                r = pred(work[ci], p)
            except Exception as e:  # noqa: BLE001 - any failure rejects the predicate
                reject(f"raised {type(e).__name__}: {str(e)[:200]} at context {ci}, position {p}")
                return
            if type(r) is not bool and not isinstance(r, np.bool_):
                reject(f"returned {type(r).__name__}, not bool, at context {ci}, position {p}")
                return
            out[k] = r
        changed = next((ci for ci, (w, c) in enumerate(zip(work, contexts)) if w != c), None)
        if changed is not None:
            reject(f"mutated `tokens` of context {changed}")
            return
        conn.send_bytes(b"o" + out.tobytes())
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        try:
            reject(f"sandbox failed: {type(e).__name__}: {str(e)[:200]}")
        except BaseException:  # noqa: BLE001, S110 - the parent then sees EOF
            pass
    finally:
        conn.close()


def evaluate(source: str, contexts: Sequence[Sequence[str]],
             positions: Sequence[tuple[int, int]] | None = None, timeout_s: float = 5.0, *,
             memory_bytes: int = 1 << 30) -> np.ndarray:
    """Run untrusted predicate source over token contexts in a separate process.

    contexts: token-text lists. positions: (context index, pos) pairs; None = every position of
    every context, in order. Returns a flat bool array aligned with the positions (for None: the
    contexts' positions concatenated; split it at numpy.cumsum of the context lengths).
    Raises PredicateRejected when the source fails check_source, or the predicate raises, returns
    a non-bool, mutates `tokens`, dies (e.g. memory over `memory_bytes` beyond what the process
    already maps) or the whole run takes over `timeout_s` seconds of wall clock. Bad contexts or
    positions raise ValueError/TypeError. The child is forked where the OS allows (Linux);
    elsewhere spawned, and then the interpreter start-up counts against the timeout."""
    check_source(source)
    if (not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not timeout_s > 0
            or timeout_s > MAX_TIMEOUT_S):
        # an untrusted predicate always runs under a finite limit (inf would disable the CPU rlimit)
        raise PredicateRejected(f"timeout_s must be positive and at most {MAX_TIMEOUT_S:g} seconds, got {timeout_s!r}")
    if isinstance(memory_bytes, (bool, np.bool_)) or not isinstance(memory_bytes, (int, np.integer)):
        raise ArgumentTypeError(f"memory_bytes must be a positive integer (bytes), got {memory_bytes!r}")
    if memory_bytes <= 0:      # 0 or less would leave the child no room, or wrap into no limit at all
        raise ArgumentError(f"memory_bytes must be a positive integer (bytes), got {memory_bytes!r}")
    memory_bytes = int(memory_bytes)
    ctx = [list(c) for c in contexts]
    for ci, c in enumerate(ctx):
        bad = next((t for t in c if not isinstance(t, str)), None)
        if bad is not None:
            raise ArgumentTypeError(f"context {ci} holds a {type(bad).__name__} token; tokens must be str")
    pos_arr = None
    if positions is not None:
        pos_arr = np.asarray(positions, dtype=np.int64) if len(positions) else np.zeros((0, 2))
        if pos_arr.ndim != 2 or pos_arr.shape[1] != 2:
            raise ArgumentError(f"positions must be (context, pos) pairs, got shape {pos_arr.shape}")
        pos_arr = pos_arr.astype(np.int64)
        lengths = np.array([len(c) for c in ctx] + [0], dtype=np.int64)
        ci = pos_arr[:, 0]
        ok = (ci >= 0) & (ci < len(ctx))
        ok &= (pos_arr[:, 1] >= 0) & (pos_arr[:, 1] < lengths[np.where(ok, ci, len(ctx))])
        if not ok.all():
            k = int(np.argmin(ok))
            raise ArgumentError(f"positions[{k}] = {tuple(pos_arr[k].tolist())} is not a (context, "
                             f"pos) pair inside the {len(ctx)} contexts")
        if len(pos_arr) == 0:
            return np.zeros(0, dtype=bool)
    mpc = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    recv, send = mpc.Pipe(duplex=False)
    cpu_s = math.ceil(timeout_s) + 2
    proc = mpc.Process(target=_run_child, args=(source, ctx, pos_arr, send, memory_bytes, cpu_s),
                       daemon=True)
    proc.start()
    send.close()  # so that the child's death reads as EOF here
    try:
        if not recv.poll(timeout_s):
            raise PredicateRejected(f"timed out after {timeout_s:g} s")
        try:
            data = recv.recv_bytes()
        except EOFError:
            proc.join(1.0)
            raise PredicateRejected(f"sandbox process died without a result (exit code "
                                    f"{proc.exitcode})") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()
    if data[:1] != b"o":
        raise PredicateRejected(data[1:].decode("utf-8", "replace"))
    return np.frombuffer(data[1:], dtype=np.uint8).astype(bool)
