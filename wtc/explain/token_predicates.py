"""Predicates over a model's own tokens, read as the strings its tokenizer decodes them to
(Hugging Face BPE / SentencePiece models; byte-level models use wtc.explain.predicates).

`TokenVocab` holds the decoded string of every token id: `tokenizer.decode([id])` with special
tokens kept and no clean-up of spaces (clean-up would turn " ." into "."), so " the" and "the"
stay apart. SentencePiece tokenizers drop the word-start marker of the first token of a decoded
text; a token whose raw form starts with the marker ("\u2581the") is given its space back (" the").

Atoms (`token_atoms(ids, vocab)` builds the library for a data set; offsets 0..max_offset, where
offset 0 is the token at pos, 1 the previous one, "token[-2]" the one before; False where
pos - offset < 0):
  - the token string equals s, for the `top` most frequent strings of the data: `token == " the"`;
  - a class of token strings: starts with space, is capitalised (first non-space character
    upper-case), is a number (digits only, around spaces), is a word (letters only), is an
    identifier, is punctuation (no letter or digit, not only space), holds a newline, is whitespace;
  - the token string ends with c, for the `chars` most frequent final characters of the data's
    tokens, and contains c, for the `chars` most frequent characters that are not letters, digits
    or space: `prev token ends with "."`;
  - position in the context: pos < 1, < 4, < 16.
Each atom is one Python test over the token string `t` (`TokenAtom.test`); its vectorised form is a
lookup table over the vocabulary computed by running that same test on every decoded string (one
definition, so the source and the arrays agree by construction, and by test). A predicate's source
is `def predicate(tokens, pos)` over the list of decoded token strings, using only SAFE_METHODS
(wtc.explain.sandbox); compositions and beam search are those of the byte grammar
(wtc.explain.predicates.Predicate, wtc.explain.predicate_search).

`encode_corpus(corpus, split, tokenizer)` is the corpus of wtc.explain.corpus tokenised by the
model's tokenizer (each file decoded as UTF-8 with replacement, then its eos token when the
tokenizer has one).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from wtc.errors import ArgumentError

__all__ = ["TokenVocab", "TokenAtom", "token_atoms", "encode_corpus", "CLASSES"]

# class name (read after "token ") -> test over the token string {t}
CLASSES: dict[str, str] = {
    "starts with space": "{t}.startswith(' ')",
    "is capitalised": "{t}.strip()[:1].isupper()",
    "is a number": "{t}.strip().isdigit()",
    "is a word": "{t}.strip().isalpha()",
    "is an identifier": "{t}.strip().isidentifier()",
    "is punctuation": "{t}.strip() != '' and not any(c.isalnum() for c in {t})",
    "holds a newline": "'\\n' in {t}",
    "is whitespace": "{t}.isspace()",
}
_MARKER = "\u2581"          # SentencePiece's word start


def _decoded(tokenizer, size: int) -> list[str]:
    n = min(len(tokenizer), size)
    out = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False,
                                 clean_up_tokenization_spaces=False)
    raw = tokenizer.convert_ids_to_tokens(list(range(n)))
    out = [" " + s if isinstance(r, str) and r.startswith(_MARKER) and not s.startswith(" ") else s
           for s, r in zip(out, raw)]
    return out + [""] * (size - n)           # ids past the tokenizer (a padded embedding) never occur in text


class TokenVocab:
    """The decoded string of every token id of a model (module docstring), with the lookup tables
    of the atoms computed on them (cached)."""

    def __init__(self, strings, name: str = "tokenizer"):
        strings = list(strings)
        if not strings or not all(isinstance(s, str) for s in strings):
            raise ArgumentError("a token vocabulary is a non-empty list of decoded token strings")
        self.strings = tuple(strings)
        self.name = name
        self._array = np.array(self.strings, dtype=object)
        self._luts: dict[tuple, np.ndarray] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer, size: int | None = None) -> "TokenVocab":
        """The vocabulary of a transformers tokenizer; `size` (the model's vocabulary, may exceed the
        tokenizer's: padded embeddings) ids in all."""
        if not callable(getattr(tokenizer, "batch_decode", None)):
            raise ArgumentError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
        size = len(tokenizer) if size is None else int(size)
        return cls(_decoded(tokenizer, size), name=f"{type(tokenizer).__name__} ({len(tokenizer)} tokens)")

    def __len__(self) -> int:
        return len(self.strings)

    def check(self, tokens) -> np.ndarray:
        """(n, T) token ids of this vocabulary as int64 (ArgumentError otherwise)."""
        t = np.asarray(tokens)
        if t.ndim != 2 or t.size == 0:
            raise ArgumentError(f"tokens must be a non-empty 2-D (n, T) array of token ids, got shape {t.shape}")
        if not np.issubdtype(t.dtype, np.integer):
            raise ArgumentError(f"tokens must hold integer token ids, got dtype {t.dtype}")
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= len(self):
            raise ArgumentError(f"token ids must lie in [0, {len(self)}) for this vocabulary, got [{lo}, {hi}]")
        return t.astype(np.int64, copy=False)

    def texts(self, ids) -> list[str]:
        """The decoded strings of a sequence of ids (what a predicate's `tokens` holds)."""
        return [self.strings[int(i)] for i in ids]

    def lut(self, test: str, arg=None) -> np.ndarray:
        """(V,) bool: `test` (a TokenAtom test over `t`) on every decoded string."""
        key = (test, arg)
        if key not in self._luts:
            if arg is not None:                      # equality: one comparison of the whole array
                out = self._array == arg
            else:
                fn = eval(f"lambda t: bool({test.format(t='t')})", {"__builtins__": {"any": any, "bool": bool}})
                out = np.fromiter((fn(s) for s in self.strings), bool, len(self.strings))
            self._luts[key] = np.asarray(out, bool)
        return self._luts[key]


def _who(offset: int) -> str:
    return "token" if offset == 0 else "prev token" if offset == 1 else f"token[-{offset}]"


def _at(offset: int) -> str:
    return "tokens[pos]" if offset == 0 else f"tokens[pos - {offset}]"


def _quoted(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


@dataclass(frozen=True)
class TokenAtom:
    """One elementary predicate over token strings. kind: 'eq' (arg: the string), 'class' (arg: a
    CLASSES name), 'ends' / 'contains' (arg: a character), 'pos' (arg k: pos < k). `offset` is the
    number of tokens back. The vocabulary is carried along, not compared."""
    kind: str
    arg: object
    offset: int = 0
    vocab: TokenVocab = field(default=None, compare=False, hash=False, repr=False)
    structural = False                          # no per-position scan (that is the byte grammar's)

    @property
    def test(self) -> str:
        """The test over the token string, with {t} for it."""
        k, a = self.kind, self.arg
        if k == "eq":
            return "{t} == " + repr(a)
        if k == "class":
            return CLASSES[a]
        if k == "ends":
            return "{t}.endswith(" + repr(a) + ")"
        if k == "contains":
            return repr(a) + " in {t}"
        raise ArgumentError(f"unknown token atom kind {k!r}")

    @property
    def name(self) -> str:
        k, a, who = self.kind, self.arg, _who(self.offset)
        if k == "pos":
            return f"pos < {a}"
        if k == "eq":
            return f"{who} == {_quoted(a)}"
        if k == "class":
            return f"{who} {a}"
        return f"{who} {'ends with' if k == 'ends' else 'contains'} {_quoted(a)}"

    @property
    def expr(self) -> str:
        """Python expression over `tokens` (decoded strings) and `pos`."""
        if self.kind == "pos":
            return f"pos < {self.arg}"
        test = self.test.format(t=_at(self.offset))
        return test if self.offset == 0 else f"(pos >= {self.offset} and {test})"

    def check(self, tokens) -> np.ndarray:
        return self.vocab.check(tokens)

    def evaluate(self, tokens, feats=None) -> np.ndarray:
        """Truth array (n, T) on token ids (n, T)."""
        ids = self.check(tokens)
        if self.kind == "pos":
            return np.broadcast_to(np.arange(ids.shape[1]) < self.arg, ids.shape).copy()
        table = self.vocab.lut(self.test, self.arg if self.kind == "eq" else None)
        out = table[ids]
        o = self.offset
        if o:
            shifted = np.zeros_like(out)
            if o < out.shape[1]:
                shifted[:, o:] = out[:, :-o]
            out = shifted
        return out


def token_atoms(tokens, vocab: TokenVocab, max_offset: int = 3, top: int = 48, chars: int = 12,
                min_count: int = 3) -> list[TokenAtom]:
    """The atom library for token ids (n, T): positions, classes, final and contained characters
    and the `top` most frequent token strings (at least `min_count` occurrences), each at every
    offset 0..max_offset (module docstring). Order: positions, classes, characters, strings (the
    search keeps the first of atoms with equal truth arrays)."""
    ids = vocab.check(tokens)
    if isinstance(max_offset, bool) or not isinstance(max_offset, int) or max_offset < 0:
        raise ArgumentError(f"max_offset must be an int >= 0, got {max_offset!r}")
    counts = np.bincount(ids.ravel(), minlength=len(vocab))
    by_string: Counter = Counter()
    last: Counter = Counter()
    inner: Counter = Counter()
    for i in np.flatnonzero(counts):
        s, c = vocab.strings[i], int(counts[i])
        by_string[s] += c
        if s:
            last[s[-1]] += c
        for ch in set(s):
            if not ch.isalnum() and not ch.isspace():
                inner[ch] += c

    def common(counter: Counter, k: int) -> list[str]:   # most frequent, then by string: deterministic
        return [s for s, c in sorted(counter.items(), key=lambda sc: (-sc[1], sc[0]))[:k] if c >= min_count]

    offsets = range(max_offset + 1)
    lib = [TokenAtom("pos", k, 0, vocab) for k in (1, 4, 16)]
    lib += [TokenAtom("class", c, o, vocab) for o in offsets for c in CLASSES]
    lib += [TokenAtom("ends", ch, o, vocab) for o in offsets for ch in common(last, chars)]
    lib += [TokenAtom("contains", ch, o, vocab) for o in offsets for ch in common(inner, chars)]
    lib += [TokenAtom("eq", s, o, vocab) for o in offsets for s in common(by_string, top)]
    return lib


def encode_corpus(corpus, split: str, tokenizer) -> np.ndarray:
    """The split's files tokenised by `tokenizer`, each followed by its eos token if it has one:
    int64 (N,). Files are the corpus's (checked against their hashes as it reads them)."""
    data = bytes(corpus.tokens(split))
    texts = [part.decode("utf-8", errors="replace") for part in data.split(corpus.separator)[:-1]]
    texts = [t for t in texts if t]
    if not texts:
        raise ArgumentError(f"the corpus's {split} split holds no text to tokenise")
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    sep = [int(eos)] if eos is not None else []
    return np.fromiter((i for row in ids for i in (*row, *sep)), np.int64)
