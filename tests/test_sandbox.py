"""wtc.explain.sandbox: malicious predicate sources are rejected with a reason; benign ones run,
in process and in the sandbox process, and agree with direct Python references."""
import numpy as np
import pytest

from wtc.explain.sandbox import (
    MAX_SOURCE_CHARS,
    SAFE_BUILTINS,
    PredicateRejected,
    check_source,
    compile_predicate,
    evaluate,
)


def body(*lines: str) -> str:
    """A predicate whose body is `lines` (then `return True`)."""
    return "def predicate(tokens, pos):\n" + "".join(f"    {ln}\n" for ln in lines) + \
        "    return True\n"


MALICIOUS = [
    ("import os\n" + body(), "line 1: import is not allowed"),
    ("from os import system\n" + body(), "line 1: import is not allowed"),
    (body("import os"), "line 2: import is not allowed"),
    (body("__import__('os')"), "name '__import__' is not allowed"),
    (body("x = ().__class__.__bases__[0].__subclasses__()"), "is not allowed"),
    (body("x = tokens.__class__"), "line 2: attribute '__class__' is not allowed"),
    (body("x = open('/etc/passwd').read()"), "is not allowed"),
    (body("x = open('/etc/passwd')"), "name 'open' is not allowed"),
    (body("exec('1')"), "name 'exec' is not allowed"),
    (body("eval('1')"), "name 'eval' is not allowed"),
    (body("compile('1', 'f', 'exec')"), "name 'compile' is not allowed"),
    (body("getattr(tokens, 'x')"), "name 'getattr' is not allowed"),
    (body("globals()"), "name 'globals' is not allowed"),
    (body("vars()"), "name 'vars' is not allowed"),
    (body("print(1)"), "name 'print' is not allowed"),
    (body("t = type(tokens)"), "name 'type' is not allowed"),
    (body("isinstance(pos, int)"), "name 'isinstance' is not allowed"),
    (body("x = _secret"), "name '_secret' is not allowed"),
    (body("x = tokens.copy()"), "attribute 'copy' is not allowed"),
    (body("x = '{0.__class__}'.format(tokens)"), "attribute 'format' is not allowed"),
    (body("while True:", "    pass"), "line 2: while loops are not allowed"),
    (body("f = lambda: 0"), "lambda is not allowed"),
    (body("x = (lambda: 0).__globals__"), "is not allowed"),
    (body("x = (lambda f: f(f))(lambda f: f(f))"), "lambda is not allowed"),
    (body("with open('/etc/passwd') as f:", "    pass"), "with statements are not allowed"),
    (body("try:", "    pass", "except Exception:", "    pass"), "try statements are not allowed"),
    (body("raise ValueError"), "raise is not allowed"),
    (body("del tokens"), "not allowed"),
    (body("global x"), "global is not allowed"),
    (body("x = [y := 1]"), "walrus"),
    (body("x = f'{tokens}'"), "f-strings are not allowed"),
    (body("x = max(*tokens)"), "starred expressions are not allowed"),
    (body("x = sorted(tokens, **{})"), "** and underscore keyword"),
    (body("x = [len][0](tokens)"), "only names and allowed methods may be called"),
    (body("tokens.x = 1"), "attribute 'x' is not allowed"),
    (body("def g():", "    return 1"), "line 2: nested function definitions are not allowed"),
    (body("class A:", "    pass"), "line 2: class definitions are not allowed"),
    ("class A:\n    pass\n" + body(), "class definitions are not allowed"),
    ("async def predicate(tokens, pos):\n    return True\n", "async functions are not allowed"),
    (body() + "def other(tokens, pos):\n    return True\n", "nothing else at top level"),
    ("X = 3\n" + body(), "nothing else at top level"),
    ("def pred(tokens, pos):\n    return True\n", "found `pred`"),
    ("def predicate(tokens):\n    return True\n", "must define exactly one function"),
    ("def predicate(tokens, pos, x=1):\n    return True\n", "must define exactly one function"),
    ("def predicate(*args):\n    return True\n", "must define exactly one function"),
    ("@max\ndef predicate(tokens, pos):\n    return True\n", "decorators are not allowed"),
    ("", "found none"),
    ("'just a docstring'\n", "found none"),
    ("def predicate(tokens, pos):\n    return (\n", "syntax error"),
    ("def predicate(tokens, pos):\n    return True\x00\n", "null bytes"),
    (body("break"), "cannot compile"),
    ("#" * (MAX_SOURCE_CHARS + 1) + "\n" + body(), "over the limit of"),
    (body("x = [" + "-1," * 1250 + "]"), "AST nodes"),
]


@pytest.mark.parametrize("source,reason", MALICIOUS, ids=[str(i) for i in range(len(MALICIOUS))])
def test_malicious_rejected(source, reason):
    with pytest.raises(PredicateRejected) as info:
        check_source(source)
    assert reason in str(info.value), str(info.value)
    with pytest.raises(PredicateRejected):
        compile_predicate(source)
    with pytest.raises(PredicateRejected):      # rejected before any process starts
        evaluate(source, [list("ab")])


def test_non_str_source_is_a_type_error():
    with pytest.raises(TypeError, match="must be a str"):
        check_source(None)


def test_builtins_of_compiled_predicate_are_the_whitelist():
    f = compile_predicate(body())
    assert set(f.__globals__["__builtins__"]) == SAFE_BUILTINS
    assert not {"open", "exec", "eval", "getattr", "__import__"} & SAFE_BUILTINS


def test_infinite_loop_times_out():
    src = body("for i in range(10**12):", "    pass")
    check_source(src)                            # statically fine: range is the timeout's job
    with pytest.raises(PredicateRejected, match=r"timed out after 1 s"):
        evaluate(src, [list("ab")], timeout_s=1.0)


def test_memory_bomb_is_stopped():
    src = body("x = 'a' * (2**29)")
    with pytest.raises(PredicateRejected, match="MemoryError"):
        evaluate(src, [list("ab")], memory_bytes=128 << 20)


def test_recursion_is_bounded():
    src = "def predicate(tokens, pos):\n    return predicate(tokens, pos)\n"
    with pytest.raises(PredicateRejected, match="RecursionError: .* at context 0, position 0"):
        evaluate(src, [list("ab")])


def test_runtime_failures_name_the_position():
    src = "def predicate(tokens, pos):\n    return tokens[pos + 1] == 'a'\n"
    with pytest.raises(PredicateRejected, match="IndexError: .* at context 0, position 3"):
        evaluate(src, [list("abcd"), list("abc")])
    with pytest.raises(PredicateRejected, match="returned int, not bool, at context 0, position 0"):
        evaluate("def predicate(tokens, pos):\n    return pos\n", [list("ab")])
    with pytest.raises(PredicateRejected, match="mutated `tokens` of context 0"):
        evaluate("def predicate(tokens, pos):\n    tokens.append('x')\n    return True\n",
                 [list("ab")])


def test_bad_positions_are_value_errors():
    with pytest.raises(ValueError, match=r"positions\[1\] = \(0, 5\)"):
        evaluate(body(), [list("ab")], positions=[(0, 1), (0, 5)])
    with pytest.raises(ValueError, match="positions must be"):
        evaluate(body(), [list("ab")], positions=[(0, 1, 2)])
    with pytest.raises(TypeError, match="context 0 holds a int token"):
        evaluate(body(), [[1, 2]])
    assert evaluate(body(), [list("ab")], positions=[]).shape == (0,)
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        evaluate(body(), [list("ab")], timeout_s=0)


def _brackets_on_line(tokens, pos):
    depth = 0
    for t in tokens[:pos + 1]:
        if t == "\n":
            depth = 0
        elif t in "([{":
            depth += 1
        elif t in ")]}" and depth > 0:
            depth -= 1
    return depth > 0


BENIGN = [
    ("return tokens[pos] == '('", lambda t, p: t[p] == "("),
    ("return pos > 0 and tokens[pos-1].isdigit()", lambda t, p: p > 0 and t[p - 1].isdigit()),
    ("return ''.join(tokens[max(0,pos-3):pos+1]).endswith('def')",
     lambda t, p: "".join(t[max(0, p - 3):p + 1]).endswith("def")),
    ("return tokens[pos] in {'+','-'}", lambda t, p: t[p] in {"+", "-"}),
    ("""depth = 0
    for t in tokens[:pos + 1]:
        if t == '\\n':
            depth = 0
        elif t in '([{':
            depth += 1
        elif t in ')]}' and depth > 0:
            depth -= 1
    return depth > 0""", _brackets_on_line),
    ("""stack = []
    for t in tokens[:pos + 1]:
        if t == '(':
            stack.append(t)
        elif t == ')' and stack:
            stack.pop()
    return len(stack) >= 2""",
     lambda t, p: _depth(t[:p + 1]) >= 2),
    ("return sum(1 for t in tokens[:pos] if t.isalpha()) % 2 == 1",
     lambda t, p: sum(1 for x in t[:p] if x.isalpha()) % 2 == 1),
    ("return any(ord(t) > 100 for t in tokens[:pos + 1])",
     lambda t, p: any(ord(x) > 100 for x in t[:p + 1])),
]


def _depth(tokens):
    d = 0
    for t in tokens:
        if t == "(":
            d += 1
        elif t == ")" and d > 0:
            d -= 1
    return d


def _src(ret: str) -> str:
    return f'"""doc"""\ndef predicate(tokens: list[str], pos: int) -> bool:\n    {ret}\n'


def _contexts(rng, n=12):
    alphabet = list("ab1( )def+-\n[]{}") + ["\xe9", "\xff"]
    return [[alphabet[i] for i in rng.integers(0, len(alphabet), rng.integers(1, 40))]
            for _ in range(n)]


@pytest.mark.parametrize("ret,ref", BENIGN, ids=[str(i) for i in range(len(BENIGN))])
def test_benign_match_reference(ret, ref, rng):
    src = _src(ret)
    check_source(src)
    f = compile_predicate(src)
    ctxs = _contexts(rng) + [list("x = def (a, (b)) + 1\n((c")]
    want = np.array([ref(c, p) for c in ctxs for p in range(len(c))], dtype=bool)
    inproc = np.array([f(c, p) for c in ctxs for p in range(len(c))], dtype=bool)
    np.testing.assert_array_equal(inproc, want)
    np.testing.assert_array_equal(evaluate(src, ctxs), want)


def test_evaluate_positions_agree_with_compile_predicate(rng):
    src = "def predicate(tokens, pos):\n    " + BENIGN[4][0] + "\n"
    f = compile_predicate(src)
    ctxs = _contexts(rng, 30)
    ci = rng.integers(0, len(ctxs), 200)
    positions = [(int(c), int(rng.integers(0, len(ctxs[c])))) for c in ci]
    got = evaluate(src, ctxs, positions=positions)
    assert got.dtype == bool and got.shape == (200,)
    np.testing.assert_array_equal(got, [f(ctxs[c], p) for c, p in positions])


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1, True, "5", 1e9])
def test_timeout_must_be_finite_and_bounded(bad):
    from wtc.explain.sandbox import PredicateRejected
    with pytest.raises(PredicateRejected, match="timeout_s"):
        evaluate(body(), [list("ab")], timeout_s=bad)
