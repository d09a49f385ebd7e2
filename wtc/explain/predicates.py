"""A grammar of token-context predicates, evaluated vectorised, and a beam search over it.

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

Compositions: ((a1 op2 a2) op3 a3) with a1 optionally negated and op in AND, OR, AND NOT (the
compositional-explanations beam search of Mu & Andreas 2020), up to `max_atoms` atoms.

Search objective (cheap: additive in the KL, no model). With K = kl.sum() and F the truth array,
    covered(f)    = kl[F].sum() / K                share of the KL mass on f-true positions
    coverage p(f) = F.mean()                       share of positions where f holds
    objective     = covered + lam * ln(max_coverage / p) - atom_cost * (number of atoms - 1)
feasible only when 0 < p(f) <= max_coverage (the gate). The exact score (wtc.explain.explainer,
conditional zero-ablation) is min(R, 1 - I), which under an additive approximation of the KL is
`covered`; covered alone is maximised by the loosest predicate the gate allows, hence two small
terms. The specificity term lam * ln(max_coverage / p) (>= 0 under the gate; lam default 0.02)
is scale-free: narrowing f to a fraction r of its positions earns lam * ln(1 / r) whether f is
common or rare, so `tok[-1] is digit AND tok[0] == '.'` beats `tok[0] == '.'` when the KL sits on
the digit-dot positions, however rare dots are; at the margin a group of positions is worth
adding to f when its mean KL exceeds lam / covered (about 2%) of the mean KL on f. (A linear
penalty lam * p would let the precision of rare predicates go almost free.) atom_cost (default
0.002) is an Occam term: an added atom must earn its place, so atoms that only trim a few low-KL
positions by chance (fitting noise; with lam, trimming a share r earns about lam * r) do not win
over the plain predicate. The results keep only predicates with lift = covered - p(f) > min_lift
(default 0: the KL is denser where f holds than over all positions) and skip a candidate whose
truth array has Jaccard similarity >= `similar` (default 0.9) with a better result, so the few
candidates returned differ. Figures reported with each result: objective, covered, coverage, lift,
and precision / recall against the importance positions (the smallest set of positions holding
`mass` of the KL): precision = share of f-true positions that are importance positions,
recall = share of importance positions where f holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Atom", "Predicate", "atoms", "search", "importance_mask", "features", "Features"]

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
def _check_tokens(tokens) -> np.ndarray:
    t = np.asarray(tokens)
    if t.ndim != 2:
        raise ValueError(f"tokens must be a 2-D (n, T) array of byte values, got shape {t.shape}")
    if t.size == 0:
        raise ValueError(f"tokens is empty (shape {t.shape})")
    if not (np.issubdtype(t.dtype, np.integer) or t.dtype == bool):
        raise ValueError(f"tokens must hold integer byte values, got dtype {t.dtype}")
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi > 255:
        raise ValueError(f"tokens must be byte values 0..255, got values in [{lo}, {hi}]")
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
    tok = _check_tokens(tokens)
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

    def evaluate(self, tokens, feats: Features | None = None) -> np.ndarray:
        """Truth array (n, T) on a byte array (n, T); `feats` (from `features`) may be shared."""
        tok = _check_tokens(tokens)
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
        raise ValueError(f"unknown atom kind {k!r}")


_OPS = ("AND", "OR", "AND NOT")
_BLOCK = 8192          # positions per float32 product block in `search` (bounds its memory)


@dataclass(frozen=True)
class Predicate:
    """((a1 op2 a2) op3 a3 ...): ops[0] is '' or 'NOT' (applied to a1), ops[i] in AND, OR, AND NOT."""
    atoms: tuple[Atom, ...]
    ops: tuple[str, ...]
    name: str = field(init=False)
    source: str = field(init=False)

    def __post_init__(self):
        if not self.atoms or len(self.atoms) != len(self.ops):
            raise ValueError(f"a predicate needs one op per atom, got {len(self.atoms)} atoms, "
                             f"{len(self.ops)} ops")
        if self.ops[0] not in ("", "NOT") or any(op not in _OPS for op in self.ops[1:]):
            raise ValueError(f"bad ops {self.ops}: the first must be '' or 'NOT', "
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
        """Truth array (n, T) (or (T,) for a 1-D context) on byte tokens, equal to the source's."""
        tok = np.asarray(tokens)
        one = tok.ndim == 1
        tok = _check_tokens(tok[None] if one else tok)
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
    tok = _check_tokens(tokens)
    if max_offset < 0:
        raise ValueError(f"max_offset must be >= 0, got {max_offset}")
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


def importance_mask(kl: np.ndarray, mass: float = 0.9) -> np.ndarray:
    """The smallest set of positions of the whole (n, T) array holding `mass` of its total KL
    (positions taken by decreasing KL, ties toward the lower flat index, the rule of
    wtc.scan.kl.importance_positions for one row), as a bool array."""
    flat = np.clip(np.asarray(kl, np.float64).ravel(), 0, None)
    out = np.zeros(flat.shape, bool)
    total = flat.sum()
    if total > 0:
        order = np.lexsort((np.arange(flat.size), -flat))
        k = int(np.searchsorted(np.cumsum(flat[order]), mass * total * (1 - 1e-12))) + 1
        out[order[:min(k, flat.size)]] = True
    return out.reshape(np.shape(kl))


def _objective(covered, p, n_atoms, lam: float, atom_cost: float, max_coverage: float):
    """The search objective (module docstring); p > 0 (array or scalar)."""
    return covered + lam * np.log(max_coverage / p) - atom_cost * (n_atoms - 1)


def _figures(pred: Predicate, F: np.ndarray, kl: np.ndarray, imp: np.ndarray, lam: float,
             atom_cost: float, max_coverage: float) -> dict:
    total = kl.sum()
    covered = float(kl[F].sum() / total)
    p = float(F.mean())
    hits = int((F & imp).sum())
    return {"objective": float(_objective(covered, p, len(pred.atoms), lam, atom_cost, max_coverage)),
            "covered": covered, "coverage": p, "lift": covered - p,
            "precision": hits / max(int(F.sum()), 1), "recall": hits / max(int(imp.sum()), 1)}


def search(tokens, kl, mass: float = 0.9, beam: int = 10, max_atoms: int = 3, max_coverage: float = 0.5,
           top: int = 5, lam: float = 0.02, atom_cost: float = 0.002, similar: float = 0.9,
           min_lift: float = 0.0, library: list[Atom] | None = None, max_offset: int = 4,
           ngram_top: int = 200) -> list[tuple[Predicate, dict]]:
    """Beam search over compositions of atoms for the predicates on which `kl` concentrates.

    tokens (n, T) bytes; kl (n, T) >= 0 (the weight's per-position KL; tiny negative values are
    clipped to 0). Level 1: every atom and its negation. Each next level extends every beam member
    by AND / OR / AND NOT with every atom not already in it. Candidates are ranked by the objective
    (module docstring); only gated ones (0 < p(f) <= max_coverage) enter the beam and the results.
    Candidates with the same truth array count once (the first found: fewer atoms, library order).
    Returns up to `top` (Predicate, figures) pairs, best first (objective, then smaller coverage,
    then fewer atoms), each with lift = covered - coverage > min_lift (the KL is denser where f
    holds than on average) and none with Jaccard similarity >= `similar` to a better one.
    figures: objective, covered, coverage, lift, precision, recall (module docstring).
    `library` (from `atoms`) replaces the default library built from `tokens`."""
    tok = _check_tokens(tokens)
    kl = np.asarray(kl, dtype=np.float64)
    if kl.shape != tok.shape:
        raise ValueError(f"kl must have the shape of tokens {tok.shape}, got {kl.shape}")
    if not np.isfinite(kl).all():
        raise ValueError(f"kl holds a non-finite value at index {tuple(np.argwhere(~np.isfinite(kl))[0])}")
    kl = np.clip(kl, 0, None)
    if kl.sum() <= 0:
        raise ValueError("kl sums to 0: the weight has no effect to explain")
    if not 0 < max_coverage <= 1 or not 0 < mass <= 1:
        raise ValueError(f"need 0 < max_coverage <= 1 and 0 < mass <= 1, got {max_coverage}, {mass}")
    if lam < 0 or atom_cost < 0 or not 0 < similar <= 1:
        raise ValueError(f"need lam >= 0, atom_cost >= 0 and 0 < similar <= 1, "
                         f"got {lam}, {atom_cost}, {similar}")
    if beam < 1 or top < 1 or max_atoms < 1:
        raise ValueError(f"beam, top and max_atoms must be >= 1, got {beam}, {top}, {max_atoms}")
    lib = list(library) if library is not None else atoms(tok, max_offset=max_offset, ngram_top=ngram_top)
    feats = features(tok) if any(a.structural for a in lib) else None
    N = tok.size
    total = kl.sum()

    # atom truth arrays, constant ones and duplicates dropped (first kept)
    seen: set[bytes] = set()
    keep, rows = [], []
    for a in lib:
        F = a.evaluate(tok, feats).ravel()
        s = int(F.sum())
        key = np.packbits(F).tobytes()
        if 0 < s < N and key not in seen:
            seen.add(key)
            keep.append(a)
            rows.append(F)
    if not keep:
        return []
    M = np.stack(rows)                                           # (A, N) bool: candidate arrays
    MT = np.ascontiguousarray(M.T)                               # (N, A) bool: row gathers
    A = len(keep)
    where = {a: i for i, a in enumerate(keep)}
    w = (kl.ravel() / total).astype(np.float32)                  # KL share per position

    def restricted(F: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """For every atom a: (share of KL on a & F, count of a & F), F = all positions when None;
        only F's positions are read (float32 products in blocks of positions)."""
        idx = np.flatnonzero(F) if F is not None else None
        n_pos = N if idx is None else idx.size
        cov = np.zeros(A, np.float32)
        cnt = np.zeros(A, np.int64)
        for s in range(0, n_pos, _BLOCK):
            sel = slice(s, min(s + _BLOCK, n_pos)) if idx is None else idx[s:s + _BLOCK]
            sub = MT[sel]
            cov += w[sel] @ sub.astype(np.float32)
            cnt += sub.sum(0)
        return cov, cnt

    kl_flat = kl.ravel()
    pool: dict[bytes, tuple] = {}      # truth key -> (pred, F, order found): every materialised candidate

    def consider(pred: Predicate, F: np.ndarray) -> bool:
        key = np.packbits(F).tobytes()
        if key in pool:
            return False
        pool[key] = (pred, F, len(pool))
        return True

    def exact(pred: Predicate, F: np.ndarray) -> tuple[float, float]:
        p = float(F.mean())
        covered = kl_flat[F].sum() / total
        return float(_objective(covered, p, len(pred.atoms), lam, atom_cost, max_coverage)), p

    def gated(count: np.ndarray) -> np.ndarray:
        return (count > 0) & (count <= max_coverage * N)

    def pick(covs: np.ndarray, counts: np.ndarray, n_atoms: int, make) -> list[tuple[Predicate, np.ndarray]]:
        """Best gated candidates by approximate (float32) objective, materialised, deduplicated,
        ranked exactly."""
        flat_c = counts.ravel()
        ok = np.flatnonzero(gated(flat_c))
        if ok.size == 0:
            return []
        flat_s = np.full(flat_c.shape, -np.inf)
        flat_s[ok] = _objective(covs.ravel()[ok].astype(np.float64), flat_c[ok] / N, n_atoms,
                                lam, atom_cost, max_coverage)
        want = min(ok.size, 4 * beam + top)
        cand = ok[np.lexsort((ok, flat_c[ok], -flat_s[ok]))][:want]
        found = []
        for idx in cand:
            pred, F = make(int(idx))
            if consider(pred, F):
                found.append((pred, F))
        found.sort(key=lambda pf: (-round(exact(*pf)[0], 12), exact(*pf)[1], len(pf[0].atoms)))
        return found[:beam]

    # level 1: atoms and their negations
    cov_all, cnt_all = restricted(None)
    cov1 = np.stack([cov_all, 1 - cov_all], 1)                   # [atom, NOT atom]
    cnt1 = np.stack([cnt_all, N - cnt_all], 1)

    def make1(idx: int):
        i, neg = divmod(idx, 2)
        F = ~M[i] if neg else M[i].copy()
        return Predicate((keep[i],), ("NOT",) if neg else ("",)), F

    beam_now = pick(cov1, cnt1, 1, make1)
    for _level in range(1, max_atoms):
        if not beam_now:
            break
        # per beam member B and atom a: a & B from B's positions; a | B and B & ~a follow from it
        cov = np.empty((A, len(beam_now), 3), np.float32)            # AND, OR, AND NOT
        cnt = np.empty((A, len(beam_now), 3), np.int64)
        for b, (pred, F) in enumerate(beam_now):
            c_and, n_and = restricted(F)
            cb, nb = w[F].sum(), int(F.sum())
            cov[:, b] = np.stack([c_and, cb + cov_all - c_and, cb - c_and], 1)
            cnt[:, b] = np.stack([n_and, nb + cnt_all - n_and, nb - n_and], 1)
            for a in pred.atoms:                                         # no atom twice
                cnt[where[a], b, :] = -1
        members = list(beam_now)

        def make(idx: int, members=members):
            i, rest = divmod(idx, len(members) * 3)
            b, o = divmod(rest, 3)
            pred, F = members[b]
            G = F & M[i] if o == 0 else F | M[i] if o == 1 else F & ~M[i]
            return Predicate(pred.atoms + (keep[i],), pred.ops + (_OPS[o],)), G

        beam_now = pick(cov, cnt, _level + 1, make)

    ranked = []
    for pred, F, ct in pool.values():
        obj, p = exact(pred, F)
        if 0 < p <= max_coverage and kl_flat[F].sum() / total - p > min_lift:
            ranked.append((-round(obj, 12), p, len(pred.atoms), ct, pred, F))
    ranked.sort(key=lambda r: r[:4])
    imp = importance_mask(kl, mass).ravel()
    out: list[tuple[Predicate, dict]] = []
    chosen: list[np.ndarray] = []
    for r in ranked:
        F = r[5]
        if any((F & G).sum() >= similar * (F | G).sum() for G in chosen):
            continue
        chosen.append(F)
        out.append((r[4], _figures(r[4], F, kl_flat, imp, lam, atom_cost, max_coverage)))
        if len(out) == top:
            break
    return out
