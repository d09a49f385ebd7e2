"""The predicate grammar (wtc.explain.predicates): every atom's and composition's source, run with
plain exec position by position, equals its vectorised truth array (random bytes and real Python
source); the lexer on a hand-checked line; the beam search finds a planted predicate, finds nothing
in diffuse KL, respects the coverage gate and is deterministic."""
import importlib
import inspect
import json.encoder

import numpy as np
import pytest

from wtc.explain import predicate_search as S
from wtc.explain import predicates as P

try:        # the whitelist the sources must pass (checked when the sandbox module is there)
    from wtc.explain.sandbox import check_source
except ImportError:
    check_source = None


def stdlib_text(*modules: str) -> bytes:
    return b"".join(inspect.getsource(importlib.import_module(m)).encode("latin-1", "replace")
                    for m in modules)


def rows(text: bytes, T: int, n: int | None = None) -> np.ndarray:
    a = np.frombuffer(text[: len(text) // T * T], np.uint8).reshape(-1, T)
    return a if n is None else a[:n]


def python_like(rng, n: int, T: int) -> np.ndarray:
    """Random bytes, half from all 256 values, half from the characters Python code is made of
    (quotes, '#', backslashes, brackets, newlines, spaces), so every lexer path is exercised."""
    alphabet = np.frombuffer(b"  \n\n\t'\"#\\\\()[]{}:.,=+-x1_a9 \"'", np.uint8)
    uniform = rng.integers(0, 256, (n, T))
    pythonic = alphabet[rng.integers(0, len(alphabet), (n, T))]
    return np.where(rng.random((n, T)) < 0.5, uniform, pythonic).astype(np.uint8)


def run_source(source: str, tokens: np.ndarray, causal_check: bool = False) -> np.ndarray:
    """Plain exec of the source with `range` and `bool` as the only builtins, at every position."""
    ns = {"__builtins__": {"range": range, "bool": bool}}
    exec(compile(source, "<predicate>", "exec"), ns)
    f = ns["predicate"]
    out = np.zeros(tokens.shape, bool)
    for r, row in enumerate(tokens):
        toks = [chr(int(b)) for b in row]
        for pos in range(len(toks)):
            v = f(toks, pos)
            assert type(v) is bool
            out[r, pos] = v
            if causal_check:
                assert f(toks[: pos + 1], pos) == v
    return out


@pytest.fixture(scope="module")
def real_tokens():
    return rows(inspect.getsource(json.encoder).encode("latin-1"), 128, 16)


def test_every_atom_source_equals_vectorised(rng, real_tokens):
    for tokens in (python_like(rng, 6, 40), real_tokens):
        lib = P.atoms(tokens, ngram_top=60, min_count=1)
        kinds = {a.kind for a in lib}
        assert kinds == {"class", "byte", "ngram", "string", "comment", "depth", "indent", "first", "col",
                         "pos"}
        feats = P.features(tokens)
        for a in lib:
            pred = P.Predicate((a,), ("",))
            want = a.evaluate(tokens, feats)
            assert want.dtype == bool and want.shape == tokens.shape
            np.testing.assert_array_equal(pred.evaluate(tokens), want, err_msg=a.name)
            np.testing.assert_array_equal(run_source(pred.source, tokens), want, err_msg=pred.source)
            if check_source is not None:
                check_source(pred.source)


def test_random_compositions_source_equals_vectorised_and_causal(rng, real_tokens):
    for tokens in (python_like(rng, 4, 40), real_tokens[:4]):
        lib = P.atoms(tokens, ngram_top=60)
        for _ in range(25):
            k = int(rng.integers(1, 4))
            structural = [a for a in lib if a.structural or a.kind == "pos"]       # half the picks
            chosen = tuple(dict.fromkeys(structural[rng.integers(len(structural))] if rng.random() < 0.5
                                         else lib[rng.integers(len(lib))] for _ in range(k)))
            k = len(chosen)
            ops = (str(rng.choice(["", "NOT"])),) + tuple(str(rng.choice(["AND", "OR", "AND NOT"]))
                                                          for _ in range(k - 1))
            pred = P.Predicate(chosen, ops)
            if check_source is not None:
                check_source(pred.source)
            got = run_source(pred.source, tokens, causal_check=True)
            np.testing.assert_array_equal(got, pred.evaluate(tokens), err_msg=pred.source)
            if k > 1:       # the left fold of the documented ops
                parts = [a.evaluate(tokens) for a in chosen]
                want = ~parts[0] if ops[0] == "NOT" else parts[0]
                for x, op in zip(parts[1:], ops[1:]):
                    want = want & x if op == "AND" else want | x if op == "OR" else want & ~x
                np.testing.assert_array_equal(got, want)


def test_lexer_and_line_features_on_a_known_line():
    text = "x = f(\"a#b\", 'c\\'d') # (c\n    if y[0]:\n"
    tokens = np.frombuffer(text.encode(), np.uint8)[None]
    f = P.features(tokens)

    def marks(arr):
        return "".join("1" if v else "0" for v in arr[0])
    # x = f("a#b", 'c\'d') # (c   strings at 6..10 and 13..18 (quotes and escape included)
    assert marks(f.in_str) == "0" * 6 + "1" * 5 + "00" + "1" * 6 + "0" * (len(text) - 19)
    assert marks(f.in_com) == "0" * 21 + "1111" + "0" * (len(text) - 25)
    # depth counts '(' and '[' in code only; the '(' in the comment and '#' in the string are ignored
    assert list(f.depth[0, :22]) == [0] * 5 + [1] * 14 + [0] * 3
    assert f.depth[0, text.index("[")] == 1 and f.depth[0, text.index("]")] == 0
    i = text.index("if")
    assert f.first[0, i] and f.first[0, 0] and f.first.sum() == 2
    assert f.indent[0, i] == 4 and f.col[0, i] == 4 and f.indent[0, text.index("\n")] == 0
    assert f.col[0, text.index("\n")] == text.index("\n")      # a newline ends its line


def test_planted_predicate_is_found_first(rng):
    tokens = rows(stdlib_text("colorsys", "json.encoder", "random"), 128)
    planted = (np.roll(np.isin(tokens, np.frombuffer(b"0123456789", np.uint8)), 1, axis=1)
               & (tokens == ord(".")))
    planted[:, 0] = False
    assert planted.sum() >= 50
    kl = np.where(planted, 1.0 + 0.1 * rng.random(tokens.shape), 1e-4 * rng.random(tokens.shape))
    found = S.search(tokens, kl)
    assert 1 <= len(found) <= 5
    best, fig = found[0]
    np.testing.assert_array_equal(best.evaluate(tokens), planted, err_msg=best.name)
    assert fig["covered"] >= 0.9 and fig["recall"] == 1.0
    assert fig["coverage"] == pytest.approx(planted.mean())
    assert all(f["objective"] <= fig["objective"] for _, f in found)


def test_diffuse_kl_has_no_good_candidate(rng, real_tokens):
    tokens = rows(stdlib_text("json.encoder"), 128)
    kl = rng.random(tokens.shape)
    found = S.search(tokens, kl)
    for pred, fig in found:
        assert fig["lift"] > 0
        assert fig["covered"] <= 0.6 and fig["lift"] <= 0.1, pred.name


def test_gate_and_figures(rng):
    tokens = rows(stdlib_text("json.encoder"), 128)
    letters = P.Atom("class", "letter").evaluate(tokens)
    kl = np.where(letters, 1.0, 0.01) * rng.random(tokens.shape)   # mass on a class too common to pass
    for gate in (0.5, 0.2):
        found = S.search(tokens, kl, max_coverage=gate, top=8)
        assert found
        for pred, fig in found:
            F = pred.evaluate(tokens)
            assert 0 < F.mean() <= gate
            assert fig["coverage"] == pytest.approx(F.mean())
            assert fig["covered"] == pytest.approx(kl[F].sum() / kl.sum())
            assert fig["objective"] == pytest.approx(fig["covered"] + 0.02 * np.log(gate / fig["coverage"])
                                                     - 0.002 * (len(pred.atoms) - 1))
        objs = [f["objective"] for _, f in found]
        assert objs == sorted(objs, reverse=True)
        truths = [p.evaluate(tokens) for p, _ in found]
        for i, F in enumerate(truths):          # the results differ: Jaccard < similar = 0.9
            for G in truths[:i]:
                assert (F & G).sum() < 0.9 * (F | G).sum()


def test_search_is_deterministic(rng):
    tokens = rows(stdlib_text("json.encoder"), 64)
    kl = rng.random(tokens.shape) ** 8 * (tokens == ord("("))
    kl[0, 0] += 1e-6
    a = S.search(tokens, kl)
    b = S.search(tokens.astype(np.int64), kl.copy(), library=P.atoms(tokens))    # int64 as from torch
    assert [(p.name, p.source, f) for p, f in a] == [(p.name, p.source, f) for p, f in b]


def test_bad_inputs_are_named():
    tokens = rows(stdlib_text("json.encoder"), 64, 4)
    with pytest.raises(ValueError, match="shape"):
        S.search(tokens, np.ones((4, 63)))
    with pytest.raises(ValueError, match="non-finite"):
        S.search(tokens, np.full(tokens.shape, np.nan))
    with pytest.raises(ValueError, match="no effect"):
        S.search(tokens, np.zeros(tokens.shape))
    with pytest.raises(ValueError, match="0..255"):
        P.atoms(tokens.astype(np.int64) + 300)
    with pytest.raises(ValueError, match="ops"):
        P.Predicate((P.Atom("first"),), ("AND",))
