"""A grammar of token-context predicates, evaluated vectorised (the beam search over it is
wtc.explain.predicate_search).

An LLM-free proposer of per-weight explanations. A predicate f(tokens, pos) -> bool looks at the
byte context tokens[:pos+1] (causal) of a position; a weight is explained by f when its per-position
KL(clean || weight zeroed) concentrates where f holds. Every predicate exists twice, equal by
construction and by test (tests/test_predicates.py):
  - vectorised: `Predicate.evaluate(tokens)` -> bool (n, T) from a byte array (n, T) with numpy;
  - as source: `Predicate.source`, a standalone `def predicate(tokens, pos)` over a list of one-char
    strings (latin-1 decoded bytes), with no imports, no attribute access, no helper functions and
    only `for ... in range(...)` loops, so it passes the sandbox whitelist (wtc.explain.sandbox).

Atoms (`atoms(tokens)` builds the library for a data set; `Atom.evaluate` computes one):
  - token class at offset o in {0, -1, ..., -max_offset}: digit, letter, identifier char
    [A-Za-z0-9_], whitespace (space, tab), newline, operator char (+-*/%=<>!&|^~@), open bracket,
    close bracket, quote, colon, comma, dot; False where pos + o < 0;
  - exact byte at offset o, for the `byte_top` most frequent bytes of the data;
  - suffix n-gram: the text ending at pos equals s, for the most frequent 2-, 3- and 4-grams;
  - per-line lexer state at pos: inside a string literal (its quotes included), inside a comment
    ('#' included). The lexer starts in code at the context start and after every newline and knows
    '...', "..." and backslash escapes. Approximations: a triple-quoted string is read as three
    one-char strings (right for one that opens and closes on the same line, so a one-line
    docstring is in a string); lines inside a multi-line string (or continued by a backslash) are
    read as code; a context that starts inside a string or comment is read as code. A newline is
    never inside a string or comment;
  - bracket depth >= k (k = 1, 2, 3): unclosed (, [, { in tokens[:pos+1], counted from the context
    start (brackets span lines), outside strings and comments; an unmatched closer is ignored
    (depth never goes below 0);
  - line structure: `first non-space of line` (tokens[pos] is not space/tab/newline and every
    character from the line start to pos-1 is a space or tab), indentation (number of leading
    space/tab characters, a tab counting one, of the current line up to and including pos) == 0
    and >= 4, 8, 12, column (pos - line start) < 4, < 8. A newline belongs to the line it ends;
    the context start counts as a line start;
  - position in the context: pos < 1, < 4, < 16.

Atoms over the decoded strings of a model's own tokens (BPE, SentencePiece) are
wtc.explain.token_predicates's; `Predicate` composes either kind.

Compositions: ((a1 op2 a2) op3 a3) with a1 optionally negated and op in AND, OR, AND NOT (the
compositional-explanations beam search of Mu & Andreas 2020), up to `max_atoms` atoms.

The beam search over this grammar is wtc.explain.predicate_search.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wtc.errors import ArgumentError

__all__ = ["Atom", "Predicate", "atoms", "features", "Features"]

# --------------------------------------------------------------------------------------------
# character classes
CLASSES: dict[str, str] = {
    "digit": "0123456789",
    "letter": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "identifier char": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_",
    "whitespace": " \t",
    "newline": "\n",
    "operator": "+-*/%=<>!&|^~@",
    "open bracket": "([{",
    "close bracket": ")]}",
    "quote": "'\"",
    "colon": ":",
    "comma": ",",
    "dot": ".",
}
_CLASS_LUT = {k: np.isin(np.arange(256), [ord(c) for c in v]) for k, v in CLASSES.items()}

# lexer states: 0 code, 1 in '...', 2 in "...", 3 comment, 4 / 5 just after a backslash in 1 / 2
_NEXT = np.zeros((6, 256), np.uint8)
_NEXT[0, :] = 0
_NEXT[0, ord("#")], _NEXT[0, ord("'")], _NEXT[0, ord('"')] = 3, 1, 2
_NEXT[1, :] = 1
_NEXT[1, ord("\\")], _NEXT[1, ord("'")] = 4, 0
_NEXT[2, :] = 2
_NEXT[2, ord("\\")], _NEXT[2, ord('"')] = 5, 0
_NEXT[3, :] = 3
_NEXT[4, :] = 1
_NEXT[5, :] = 2
_NEXT[:, ord("\n")] = 0
_IN_STR = np.array([False, True, True, False, True, True])
_OPEN = _CLASS_LUT["open bracket"]
_CLOSE = _CLASS_LUT["close bracket"]
_NL, _SP, _TAB = ord("\n"), ord(" "), ord("\t")

# The per-position scan, inlined in the source of every predicate that uses a structural atom
# (string, comment, depth, indentation, column, first non-space). It mirrors `features` exactly.
_PREAMBLE = '''\
    # one pass over tokens[:pos+1]: lexer state, bracket depth, line start, indentation
    st = 0
    prev = 0
    depth = 0
    start = 0
    indent = 0
    lead = True
    for i in range(pos + 1):
        c = tokens[i]
        if i > 0 and tokens[i - 1] == '\\n':
            start = i
            indent = 0
            lead = True
        if lead and (c == ' ' or c == '\\t'):
            indent = indent + 1
        else:
            lead = False
        prev = st
        if c == '\\n':
            st = 0
        elif st == 0:
            if c == '#':
                st = 3
            elif c == "'":
                st = 1
            elif c == '"':
                st = 2
        elif st == 1 or st == 2:
            if c == '\\\\':
                st = st + 3
            elif (st == 1 and c == "'") or (st == 2 and c == '"'):
                st = 0
        elif st >= 4:
            st = st - 3
        if prev == 0 and st == 0:
            if c == '(' or c == '[' or c == '{':
                depth = depth + 1
            elif (c == ')' or c == ']' or c == '}') and depth > 0:
                depth = depth - 1
    c = tokens[pos]
    col = pos - start
    in_str = c != '\\n' and (prev == 1 or prev == 2 or prev >= 4 or st == 1 or st == 2 or st >= 4)
    in_com = c != '\\n' and (prev == 3 or st == 3)
    first = c != ' ' and c != '\\t' and c != '\\n' and indent == col
'''


# --------------------------------------------------------------------------------------------
def check_tokens(tokens) -> np.ndarray:
    t = np.asarray(tokens)
    if t.ndim != 2:
        raise ArgumentError(f"tokens must be a 2-D (n, T) array of byte values, got shape {t.shape}")
    if t.size == 0:
        raise ArgumentError(f"tokens is empty (shape {t.shape})")
    if not (np.issubdtype(t.dtype, np.integer) or t.dtype == bool):
        raise ArgumentError(f"tokens must hold integer byte values, got dtype {t.dtype}")
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi > 255:
        raise ArgumentError(f"tokens must be byte values 0..255, got values in [{lo}, {hi}]")
    return t.astype(np.uint8, copy=False)


@dataclass
class Features:
    """Structural per-position arrays of a byte array (n, T), all computed causally."""
    in_str: np.ndarray     # bool
    in_com: np.ndarray     # bool
    depth: np.ndarray      # int32
    indent: np.ndarray     # int32
    col: np.ndarray        # int32
    first: np.ndarray      # bool


def features(tokens) -> Features:
    """The lexer / bracket / line scan of `_PREAMBLE`, vectorised over rows (a loop over T)."""
    tok = check_tokens(tokens)
    n, T = tok.shape
    in_str = np.zeros((n, T), bool)
    in_com = np.zeros((n, T), bool)
    depth = np.zeros((n, T), np.int32)
    indent = np.zeros((n, T), np.int32)
    col = np.zeros((n, T), np.int32)
    st = np.zeros(n, np.uint8)
    d = np.zeros(n, np.int32)
    start = np.zeros(n, np.int32)
    ind = np.zeros(n, np.int32)
    lead = np.ones(n, bool)
    for t in range(T):
        c = tok[:, t]
        if t > 0:
            nl = tok[:, t - 1] == _NL
            start[nl] = t
            ind[nl] = 0
            lead |= nl
        ws = (c == _SP) | (c == _TAB)
        lead &= ws
        ind += lead
        prev = st
        st = _NEXT[prev, c]
        not_nl = c != _NL
        in_str[:, t] = not_nl & (_IN_STR[prev] | _IN_STR[st])
        in_com[:, t] = not_nl & ((prev == 3) | (st == 3))
        code = (prev == 0) & (st == 0)
        d += code & _OPEN[c]
        d -= code & _CLOSE[c] & (d > 0)
        depth[:, t] = d
        indent[:, t] = ind
        col[:, t] = t - start
    first = ~(np.isin(tok, [_SP, _TAB, _NL])) & (indent == col)
    return Features(in_str, in_com, depth, indent, col, first)


# --------------------------------------------------------------------------------------------
def _shift(a: np.ndarray, k: int) -> np.ndarray:
    """a[:, t - k] at t (k >= 0), False before the context start."""
    if k == 0:
        return a
    out = np.zeros_like(a)
    if k < a.shape[1]:
        out[:, k:] = a[:, :-k]
    return out


def _at(k: int) -> str:
    return "tokens[pos]" if k == 0 else f"tokens[pos - {k}]"


@dataclass(frozen=True)
class Atom:
    """One elementary predicate. kind: 'class' (arg: class name, offset), 'byte' (arg: byte value,
    offset), 'ngram' (arg: the bytes), 'string', 'comment', 'depth' (arg k), 'indent' (arg k:
    >= k, or == 0 when k == 0), 'first', 'col' (arg k: col < k), 'pos' (arg k: pos < k).
    `offset` is the number of positions back (0: the token at pos; 2: tokens[pos - 2])."""
    kind: str
    arg: object = None
    offset: int = 0

    @property
    def structural(self) -> bool:
        """Needs the per-position scan (`_PREAMBLE` / `features`)."""
        return self.kind in ("string", "comment", "depth", "indent", "first", "col")

    @property
    def name(self) -> str:
        k, a, o = self.kind, self.arg, self.offset
        if k == "class":
            return f"tok[{-o}] is {a}"
        if k == "byte":
            return f"tok[{-o}] == {chr(a)!r}"
        if k == "ngram":
            return f"text ends with {bytes(a).decode('latin-1')!r}"
        return {"string": "inside string", "comment": "inside comment",
                "depth": f"bracket depth >= {a}",
                "indent": "indent == 0" if a == 0 else f"indent >= {a}",
                "first": "first non-space of line", "col": f"column < {a}", "pos": f"pos < {a}"}[k]

    @property
    def expr(self) -> str:
        """Python expression over `tokens`, `pos` (and the preamble's variables when structural)."""
        k, a, o = self.kind, self.arg, self.offset
        if k in ("class", "byte"):
            chars = CLASSES[a] if k == "class" else chr(a)
            test = f"{_at(o)} in {chars!r}" if len(chars) > 1 else f"{_at(o)} == {chars!r}"
            return test if o == 0 else f"(pos >= {o} and {test})"
        if k == "ngram":
            m = len(a)
            terms = [f"{_at(m - 1 - j)} == {chr(b)!r}" for j, b in enumerate(a)]
            return "(" + " and ".join([f"pos >= {m - 1}"] + terms) + ")"
        return {"string": "in_str", "comment": "in_com", "depth": f"depth >= {a}",
                "indent": "indent == 0" if a == 0 else f"indent >= {a}", "first": "first",
                "col": f"col < {a}", "pos": f"pos < {a}"}[k]

    def check(self, tokens) -> np.ndarray:
        """The tokens this atom reads, checked (byte values; token-string atoms check token ids)."""
        return check_tokens(tokens)

    def evaluate(self, tokens, feats: Features | None = None) -> np.ndarray:
        """Truth array (n, T) on a byte array (n, T); `feats` (from `features`) may be shared."""
        tok = check_tokens(tokens)
        k, a, o = self.kind, self.arg, self.offset
        if k == "class":
            return _shift(_CLASS_LUT[a][tok], o)
        if k == "byte":
            return _shift(tok == a, o)
        if k == "ngram":
            m = len(a)
            out = np.ones(tok.shape, bool)
            for j, b in enumerate(a):
                out &= _shift(tok == b, m - 1 - j)
            out[:, :m - 1] = False
            return out
        if k == "pos":
            return np.broadcast_to(np.arange(tok.shape[1]) < a, tok.shape).copy()
        f = feats if feats is not None else features(tok)
        if k == "string":
            return f.in_str.copy()
        if k == "comment":
            return f.in_com.copy()
        if k == "depth":
            return f.depth >= a
        if k == "indent":
            return f.indent == 0 if a == 0 else f.indent >= a
        if k == "first":
            return f.first.copy()
        if k == "col":
            return f.col < a
        raise ArgumentError(f"unknown atom kind {k!r}")


OPS = ("AND", "OR", "AND NOT")


@dataclass(frozen=True)
class Predicate:
    """((a1 op2 a2) op3 a3 ...): ops[0] is '' or 'NOT' (applied to a1), ops[i] in AND, OR, AND NOT."""
    atoms: tuple[Atom, ...]
    ops: tuple[str, ...]
    name: str = field(init=False)
    source: str = field(init=False)

    def __post_init__(self):
        if not self.atoms or len(self.atoms) != len(self.ops):
            raise ArgumentError(f"a predicate needs one op per atom, got {len(self.atoms)} atoms, "
                             f"{len(self.ops)} ops")
        if self.ops[0] not in ("", "NOT") or any(op not in OPS for op in self.ops[1:]):
            raise ArgumentError(f"bad ops {self.ops}: the first must be '' or 'NOT', "
                             "the rest AND, OR or AND NOT")
        def paren(e: str) -> str:          # atom expressions are simple or wrapped whole
            return f"({e})" if " " in e and not e.startswith("(") else e

        name = ("NOT " if self.ops[0] else "") + self.atoms[0].name
        expr = ("not " if self.ops[0] else "") + paren(self.atoms[0].expr)
        for i, (a, op) in enumerate(zip(self.atoms[1:], self.ops[1:])):
            if i > 0:
                name, expr = f"({name})", f"({expr})"
            name = f"{name} {op} {a.name}"
            expr = f"{expr} {op.lower()} {paren(a.expr)}"
        lines = ["def predicate(tokens, pos):", f"    # {name}"]
        if any(a.structural for a in self.atoms):
            lines.append(_PREAMBLE.rstrip("\n"))
        lines.append(f"    return bool({expr})")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "source", "\n".join(lines) + "\n")

    def evaluate(self, tokens) -> np.ndarray:
        """Truth array (n, T) (or (T,) for a 1-D context) on byte tokens (token ids for the atoms of
        wtc.explain.token_predicates), equal to the source's."""
        tok = np.asarray(tokens)
        one = tok.ndim == 1
        tok = self.atoms[0].check(tok[None] if one else tok)
        feats = features(tok) if any(a.structural for a in self.atoms) else None
        out = self.atoms[0].evaluate(tok, feats)
        if self.ops[0]:
            out = ~out
        for a, op in zip(self.atoms[1:], self.ops[1:]):
            x = a.evaluate(tok, feats)
            out = out & x if op == "AND" else out | x if op == "OR" else out & ~x
        return out[0] if one else out

    def __call__(self, tokens) -> np.ndarray:
        return self.evaluate(tokens)


# --------------------------------------------------------------------------------------------
def _top_ngrams(tok: np.ndarray, m: int, k: int, min_count: int) -> list[tuple[int, ...]]:
    n, T = tok.shape
    if T < m or k <= 0:
        return []
    code = np.zeros((n, T - m + 1), np.int64)
    for j in range(m):
        code = code * 256 + tok[:, j:T - m + 1 + j]
    vals, counts = np.unique(code.ravel(), return_counts=True)
    order = np.lexsort((vals, -counts))[:k]                     # most frequent, then by value
    out = []
    for v, c in zip(vals[order], counts[order]):
        if c < min_count:
            break
        out.append(tuple(int(v) >> (8 * (m - 1 - j)) & 255 for j in range(m)))
    return out


def atoms(tokens, max_offset: int = 4, ngram_top: int = 200, byte_top: int = 48,
          min_count: int = 3) -> list[Atom]:
    """The atom library for a data set (n, T) of bytes: the fixed atoms plus exact-byte atoms for
    the `byte_top` most frequent bytes (at least `min_count` occurrences) at every offset
    0..max_offset and suffix n-gram atoms for the most frequent n-grams (n = 2, 3, 4, ngram_top
    split evenly between them, at least `min_count` occurrences; counted within rows). Order:
    structural, classes, bytes, n-grams (search keeps the first of atoms with equal truth arrays)."""
    tok = check_tokens(tokens)
    if max_offset < 0:
        raise ArgumentError(f"max_offset must be >= 0, got {max_offset}")
    lib = [Atom("string"), Atom("comment"), *(Atom("depth", k) for k in (1, 2, 3)),
           Atom("first"), *(Atom("indent", k) for k in (0, 4, 8, 12)), *(Atom("col", k) for k in (4, 8)),
           *(Atom("pos", k) for k in (1, 4, 16))]
    offsets = range(max_offset + 1)
    lib += [Atom("class", c, o) for o in offsets for c in CLASSES]
    counts = np.bincount(tok.ravel(), minlength=256)
    order = np.lexsort((np.arange(256), -counts))[:byte_top]
    common = [int(b) for b in order if counts[b] >= min_count]
    lib += [Atom("byte", b, o) for o in offsets for b in common]
    per_n = -(-ngram_top // 3)
    for m in (2, 3, 4):
        lib += [Atom("ngram", g) for g in _top_ngrams(tok, m, per_n, min_count)]
    return lib
