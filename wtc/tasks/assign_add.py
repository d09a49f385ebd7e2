"""Assign-and-Add: variable binding + addition mod 59, in sequences of 16 tokens.

    [ 12-token prefix: 1-6 assignments "var value" in shuffled order, PADs in the gaps ] + LHS RHS =

Vocabulary (74): 0-58 the numbers mod 59, 59 "+", 60 "=", 61 PAD, 62-73 the variables a-l. Each
side of the core is a number or a variable assigned in the prefix; the label, read at "=" (position
15), is (n1 + n2) mod 59 of the resolved values. Kinds: 0-var, 1-var left, 1-var right, 2-var (two
distinct variables, so at least two assignments); assignments nobody asks for are distractors.

Generalisation structure (seeded, `AssignAdd(...)`): a fraction 1 - f of the 59^2 ordered pairs
(n1, n2) never occurs in training in any form (as numbers or through variables); some variables
never stand on the right in training (`no_right`), others never on the left (`no_left`); `r` is the
2-var share of training sequences, the rest split evenly over 0-var, 1-var left, 1-var right.
Every training batch gets fresh surface forms (distractors, order, padding).

Evaluation pools (`pools()`): 0-var held-out pairs (each held-out pair exactly once), 1-var with
held-out pairs, 1-var with a variable in its forbidden position, 2-var valid / one restricted
variable / two restricted / held-out pairs; "2var_union" is the union of the four 2-var pools.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

P = 59
PLUS, EQUALS, PAD = 59, 60, 61
VAR0, N_VARS = 62, 12
VOCAB = 74
SEQ_LEN = 16
PREFIX = 12
MAX_ASSIGN = PREFIX // 2
ANSWER_POS = SEQ_LEN - 1
KINDS = ("0var", "1var_left", "1var_right", "2var")
TWO_VAR_POOLS = ("2var_valid", "2var_restricted1", "2var_restricted2", "2var_heldout")


def var_token(letter: str) -> int:
    if len(letter) != 1 or not "a" <= letter <= "l":
        raise ValueError(f"variables are the letters a-l, got {letter!r}")
    return VAR0 + ord(letter) - ord("a")


def decode(tokens) -> str:
    """A sequence as text: 'b 17 _ a 3 _ ... + a 5 ='."""
    names = {PLUS: "+", EQUALS: "=", PAD: "_"}
    return " ".join(names.get(int(t), chr(ord("a") + int(t) - VAR0) if int(t) >= VAR0 else str(int(t)))
                    for t in tokens)


@dataclass
class AssignAdd:
    """The task with its seeded train / held-out split and positional restrictions."""
    f: float = 0.7                      # fraction of the 59^2 pairs seen in training
    r: float = 0.25                     # 2-var share of training sequences
    no_right: tuple[str, ...] = ("a", "b", "c")   # never on the right in training
    no_left: tuple[str, ...] = ("d", "e", "f")    # never on the left in training
    seed: int = 0
    train_pairs: np.ndarray = field(init=False, repr=False)     # (n_train, 2)
    heldout_pairs: np.ndarray = field(init=False, repr=False)   # (n_heldout, 2)

    def __post_init__(self) -> None:
        if not 0.0 < self.f <= 1.0:
            raise ValueError(f"AssignAdd.f (training fraction of pairs) must be in (0, 1], got {self.f}")
        if not 0.0 <= self.r <= 1.0:
            raise ValueError(f"AssignAdd.r (2-var share) must be in [0, 1], got {self.r}")
        self.no_right, self.no_left = tuple(self.no_right), tuple(self.no_left)
        nr = [var_token(v) for v in self.no_right]
        nl = [var_token(v) for v in self.no_left]
        if set(nr) & set(nl):
            raise ValueError(f"a variable cannot be barred from both sides: {sorted(set(self.no_right) & set(self.no_left))}")
        every = np.arange(VAR0, VAR0 + N_VARS)
        self.left_ok = np.array([v for v in every if v not in nl])     # allowed on the left in training
        self.right_ok = np.array([v for v in every if v not in nr])
        self.left_barred, self.right_barred = np.array(nl, dtype=np.int64), np.array(nr, dtype=np.int64)
        pairs = np.stack(np.meshgrid(np.arange(P), np.arange(P), indexing="ij"), -1).reshape(-1, 2)
        order = np.random.default_rng([self.seed, 59]).permutation(len(pairs))
        n_train = int(round(self.f * len(pairs)))
        self.train_pairs, self.heldout_pairs = pairs[np.sort(order[:n_train])], pairs[np.sort(order[n_train:])]
        self.is_train = np.zeros((P, P), bool)
        self.is_train[self.train_pairs[:, 0], self.train_pairs[:, 1]] = True

    # ------------------------------------------------------------------ generation
    def sample_train(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """A fresh training batch: tokens (n, 16) int64 and labels (n,) int64."""
        q = (1.0 - self.r) / 3.0
        kind = rng.choice(4, size=n, p=[q, q, q, self.r])
        pairs = self.train_pairs[rng.integers(0, len(self.train_pairs), n)]
        return self.build(rng, pairs, kind, self.left_ok, self.right_ok)

    def build(self, rng: np.random.Generator, pairs: np.ndarray, kind: np.ndarray,
              left_vars: np.ndarray, right_vars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sequences for given (n1, n2) pairs and kinds (indices into KINDS); a variable on the left
        is drawn from `left_vars`, on the right from `right_vars` (the two distinct for 2-var)."""
        pairs, kind = np.asarray(pairs, np.int64), np.asarray(kind, np.int64)
        n = len(kind)
        if pairs.shape != (n, 2) or pairs.min(initial=0) < 0 or pairs.max(initial=0) >= P:
            raise ValueError(f"pairs must be (n, 2) numbers in [0, {P}) matching {n} kinds, got {pairs.shape}")
        if kind.min(initial=0) < 0 or kind.max(initial=0) > 3:
            raise ValueError("kind indexes KINDS (0-3)")
        left_is_var = (kind == 1) | (kind == 3)
        right_is_var = (kind == 2) | (kind == 3)
        lhs_var = np.asarray(left_vars)[rng.integers(0, len(left_vars), n)]
        rhs_var = np.asarray(right_vars)[rng.integers(0, len(right_vars), n)]
        clash = right_is_var & left_is_var & (lhs_var == rhs_var)
        while clash.any():                      # 2-var: two distinct variables
            rhs_var[clash] = np.asarray(right_vars)[rng.integers(0, len(right_vars), int(clash.sum()))]
            clash = right_is_var & left_is_var & (lhs_var == rhs_var)
        # assignments: the referenced variables first, then distractors from the unused variables
        n_ref = left_is_var.astype(np.int64) + right_is_var
        k = rng.integers(np.maximum(n_ref, 1), MAX_ASSIGN + 1)                     # 1..6, >= n_ref
        keys = rng.random((n, N_VARS))
        used = np.zeros((n, N_VARS), bool)
        rows = np.arange(n)
        used[rows[left_is_var], lhs_var[left_is_var] - VAR0] = True
        used[rows[right_is_var], rhs_var[right_is_var] - VAR0] = True
        keys[used] = -1.0                                                       # referenced first
        assign_vars = np.argsort(keys, axis=1)[:, :MAX_ASSIGN] + VAR0             # (n, 6)
        values = rng.integers(0, P, (n, MAX_ASSIGN))
        values[rows[left_is_var], 0] = pairs[left_is_var, 0]
        assign_vars[left_is_var, 0] = lhs_var[left_is_var]          # the left variable in slot 0
        rslot = np.where(left_is_var, 1, 0)                              # the right one next
        assign_vars[rows[right_is_var], rslot[right_is_var]] = rhs_var[right_is_var]
        values[rows[right_is_var], rslot[right_is_var]] = pairs[right_is_var, 1]
        # layout: k pair items (length 2) and 12 - 2k PADs (length 1), in a random order
        n_items = PREFIX - k                                                    # k + (12 - 2k)
        slot = np.arange(PREFIX - 1)[None, :]                                    # at most 11 items
        is_pair = slot < k[:, None]
        valid = slot < n_items[:, None]
        order = np.argsort(np.where(valid, rng.random(valid.shape), 2.0), axis=1)
        item_pair = np.take_along_axis(is_pair, order, 1) & np.take_along_axis(valid, order, 1)
        item_id = np.take_along_axis(np.broadcast_to(slot, order.shape), order, 1)   # which assignment
        length = np.where(np.take_along_axis(valid, order, 1), np.where(item_pair, 2, 1), 0)
        start = np.cumsum(length, 1) - length
        tokens = np.full((n, SEQ_LEN), PAD, np.int64)
        r_i, c_i = np.nonzero(item_pair)
        a = item_id[r_i, c_i]
        s = start[r_i, c_i]
        tokens[r_i, s] = assign_vars[r_i, a]
        tokens[r_i, s + 1] = values[r_i, a]
        tokens[:, PREFIX] = PLUS
        tokens[:, PREFIX + 1] = np.where(left_is_var, lhs_var, pairs[:, 0])
        tokens[:, PREFIX + 2] = np.where(right_is_var, rhs_var, pairs[:, 1])
        tokens[:, ANSWER_POS] = EQUALS
        return tokens, (pairs[:, 0] + pairs[:, 1]) % P

    # ------------------------------------------------------------------ evaluation
    def pools(self, n: int = 1024, seed: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Fixed evaluation pools: name -> (tokens (m, 16), labels (m,))."""
        rng = np.random.default_rng([self.seed, seed, 7])
        tr, ho = self.train_pairs, self.heldout_pairs
        every = np.arange(VAR0, VAR0 + N_VARS)

        def pick(pairs, m):
            return pairs[rng.integers(0, len(pairs), m)]

        def ones(side: str, m):                       # 1-var kinds: the variable left, right or alternating
            return {"left": np.full(m, 1), "right": np.full(m, 2), "both": 1 + np.arange(m) % 2}[side]

        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if len(ho):
            out["0var_heldout"] = self.build(rng, ho, np.zeros(len(ho), np.int64), every, every)
        out["0var_train"] = self.build(rng, pick(tr, n), np.zeros(n, np.int64), every, every)
        if len(ho):
            out["1var_heldout"] = self.build(rng, pick(ho, n), ones("both", n), self.left_ok, self.right_ok)
        half = n // 2
        left = self.build(rng, pick(tr, half), ones("left", half), self.left_barred, self.right_ok) \
            if len(self.left_barred) else None
        right = self.build(rng, pick(tr, n - half), ones("right", n - half), self.left_ok, self.right_barred) \
            if len(self.right_barred) else None
        parts = [p for p in (left, right) if p is not None]
        if parts:
            out["1var_restricted"] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        two = np.full(n, 3, np.int64)
        out["2var_valid"] = self.build(rng, pick(tr, n), two, self.left_ok, self.right_ok)
        if len(self.left_barred) and len(self.right_barred):
            a = self.build(rng, pick(tr, half), two[:half], self.left_barred, self.right_ok)
            b = self.build(rng, pick(tr, n - half), two[half:], self.left_ok, self.right_barred)
            out["2var_restricted1"] = (np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
            out["2var_restricted2"] = self.build(rng, pick(tr, n), two, self.left_barred, self.right_barred)
        if len(ho):
            out["2var_heldout"] = self.build(rng, pick(ho, n), two, self.left_ok, self.right_ok)
        parts = [out[k] for k in TWO_VAR_POOLS if k in out]
        out["2var_union"] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        return out


def resolve(tokens: np.ndarray) -> np.ndarray:
    """The label of each sequence computed from its tokens alone (a check on `build`):
    (n, 16) -> (n,); -1 where a referenced variable is unassigned or the layout is broken."""
    tokens = np.asarray(tokens)
    out = np.full(len(tokens), -1, np.int64)
    for i, seq in enumerate(tokens):
        env, t = {}, 0
        while t < PREFIX:
            if seq[t] == PAD:
                t += 1
            elif seq[t] >= VAR0 and t + 1 < PREFIX and seq[t + 1] < P and seq[t] not in env:
                env[int(seq[t])] = int(seq[t + 1])
                t += 2
            else:
                break
        if t != PREFIX or seq[PREFIX] != PLUS or seq[ANSWER_POS] != EQUALS:
            continue
        sides = [int(s) if s < P else env.get(int(s), -1) for s in seq[PREFIX + 1:PREFIX + 3]]
        if min(sides) >= 0:
            out[i] = (sides[0] + sides[1]) % P
    return out


__all__ = ["AssignAdd", "resolve", "decode", "var_token", "VOCAB", "SEQ_LEN", "P", "PLUS", "EQUALS", "PAD",
           "VAR0", "N_VARS", "ANSWER_POS", "KINDS", "TWO_VAR_POOLS"]
