"""Assign-and-Add: variable binding + addition mod 59, in sequences of 16 tokens.

    [ 12-token prefix: 1-6 assignments "var value" in shuffled order, PADs in the gaps ] + LHS RHS =

Vocabulary (74): 0-58 the numbers mod 59, 59 "+", 60 "=", 61 PAD, 62-73 the variables a-l. Each
side of the core is a number or a variable assigned in the prefix; the label, read at "=" (position
15), is (n1 + n2) mod 59 of the resolved values. Kinds: 0-var, 1-var left, 1-var right, 2-var (two
distinct variables, so at least two assignments); assignments nobody asks for are distractors.

Two definitions (`variant`):
- "authors" (default), as in the authors' released code (bexoo/assign-and-add: train.py,
  eval_pools.py). Pairs: Python's random.Random(seed).sample of floor(f * 59^2) ordered pairs, in
  row-major order, are the training pairs (seed 42: theirs exactly). Training data is a table of
  rows (variable, kind, n1, n2) over the training pairs, sampled uniformly: per pair 12 0-var rows,
  a 1-var-left row for each variable allowed on the left, a 1-var-right row for each allowed on the
  right, and one 2-var row per variable allowed on the left, each kept with probability `r`
  (independently, fixed by random.Random(seed + row index) as theirs); a 2-var row draws its two
  variables uniformly from the pairs (x, y), x != y, x allowed on the left, y on the right. With the
  default restrictions (a, b never on the right, k, l never on the left) the four kinds weigh
  12 : 10 : 10 : 10 r (r = 1: 28.6 / 23.8 / 23.8 / 23.8%; r = 0.2: 2-var 2/34 = 5.9%). A training
  sequence has k ~ U{1..6} assignments, raised to 2 for 2-var (so a 2-var sequence has exactly 2
  with probability 1/3); evaluation sequences draw k ~ U{2..6} for 2-var (their eval builder).
  The assignments are the referenced ones plus distinct random distractors, shuffled; each of the
  12 - 2k PADs goes independently into one of the k + 1 gaps around them.
- "wtc-v1" (this project's first definition, issue 8): a round(f * 59^2) split from a numpy
  permutation, a, b, c never on the right and d, e, f never on the left, `r` the 2-var share of
  training sequences (the rest even over 0-var, 1-var left, 1-var right), 2-var k ~ U{2..6}, and the
  k assignments and 12 - 2k PADs laid out in a uniformly shuffled order.

Evaluation pools (`pools()`): 0-var held-out pairs (each held-out pair exactly once), 0-var train,
1-var with held-out pairs, 1-var with a variable in its forbidden position, 2-var valid / one
restricted variable / two restricted / held-out pairs. "2var_union": wtc-v1, the four 2-var pools
concatenated; authors, a uniform sample (4 n) of the exhaustive union. `exhaustive_2var_union()`:
the authors' final evaluation set, every (pair, variable pair) of: held-out pairs x valid variable
pairs, training pairs x pairs with exactly one variable in a forbidden position, training pairs x
both forbidden (193,580 sequences for the authors' task: 49.7 / 45.3 / 5.0%), one random surface
form each (the authors' layout, whichever the variant).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from wtc.errors import TaskError

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
        raise TaskError(f"variables are the letters a-l, got {letter!r}")
    return VAR0 + ord(letter) - ord("a")


def decode(tokens) -> str:
    """A sequence as text: 'b 17 _ a 3 _ ... + a 5 ='."""
    names = {PLUS: "+", EQUALS: "=", PAD: "_"}
    return " ".join(names.get(int(t), chr(ord("a") + int(t) - VAR0) if int(t) >= VAR0 else str(int(t)))
                    for t in tokens)


VARIANTS = ("authors", "wtc-v1")
# per variant: (never on the right, never on the left), r, seed of the pair split
_DEFAULTS = {"authors": (("a", "b"), ("k", "l"), 1.0, 42), "wtc-v1": (("a", "b", "c"), ("d", "e", "f"), 0.25, 0)}
UNION_CATEGORIES = ("heldout_pairs", "restricted1", "restricted2")


@dataclass
class AssignAdd:
    """The task with its seeded train / held-out split and positional restrictions; None fields take
    the variant's defaults (authors: r 1.0, a, b never right, k, l never left, seed 42; wtc-v1: r
    0.25, a, b, c never right, d, e, f never left, seed 0)."""
    f: float = 0.7                      # fraction of the 59^2 pairs seen in training
    r: float | None = None              # authors: keep-probability of a 2-var row; wtc-v1: 2-var share
    no_right: tuple[str, ...] | None = None   # never on the right in training
    no_left: tuple[str, ...] | None = None    # never on the left in training
    seed: int | None = None             # seed of the pair split (authors: also of the 2-var row filter)
    variant: str = "authors"
    train_pairs: np.ndarray = field(init=False, repr=False)     # (n_train, 2)
    heldout_pairs: np.ndarray = field(init=False, repr=False)   # (n_heldout, 2)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise TaskError(f"AssignAdd.variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        d_right, d_left, d_r, d_seed = _DEFAULTS[self.variant]
        self.no_right = tuple(d_right if self.no_right is None else self.no_right)
        self.no_left = tuple(d_left if self.no_left is None else self.no_left)
        self.r = d_r if self.r is None else self.r
        self.seed = d_seed if self.seed is None else self.seed
        if not 0.0 < self.f <= 1.0:
            raise TaskError(f"AssignAdd.f (training fraction of pairs) must be in (0, 1], got {self.f}")
        what = "2-var row keep-probability" if self.variant == "authors" else "2-var share"
        if not 0.0 <= self.r <= 1.0:
            raise TaskError(f"AssignAdd.r ({what}) must be in [0, 1], got {self.r}")
        nr = [var_token(v) for v in self.no_right]
        nl = [var_token(v) for v in self.no_left]
        if set(nr) & set(nl):
            raise TaskError(f"a variable cannot be barred from both sides: {sorted(set(self.no_right) & set(self.no_left))}")
        every = np.arange(VAR0, VAR0 + N_VARS)
        self.left_ok = np.array([v for v in every if v not in nl])     # allowed on the left in training
        self.right_ok = np.array([v for v in every if v not in nr])
        self.left_barred, self.right_barred = np.array(nl, dtype=np.int64), np.array(nr, dtype=np.int64)
        pairs = np.stack(np.meshgrid(np.arange(P), np.arange(P), indexing="ij"), -1).reshape(-1, 2)
        if self.variant == "authors":
            n_train = int(np.floor(self.f * len(pairs) + 1e-9))
            picked = random.Random(self.seed).sample(range(len(pairs)), n_train)   # row-major pair indices
            train = np.zeros(len(pairs), bool)
            train[picked] = True
            self.train_pairs, self.heldout_pairs = pairs[train], pairs[~train]
        else:
            order = np.random.default_rng([self.seed, 59]).permutation(len(pairs))
            n_train = int(round(self.f * len(pairs)))
            self.train_pairs, self.heldout_pairs = pairs[np.sort(order[:n_train])], pairs[np.sort(order[n_train:])]
        self.is_train = np.zeros((P, P), bool)
        self.is_train[self.train_pairs[:, 0], self.train_pairs[:, 1]] = True
        if self.variant == "authors":
            self.rows = self._training_rows()

    # ------------------------------------------------------------------ the authors' definitions
    def _training_rows(self) -> np.ndarray:
        """(m, 4) rows (kind, n1, n2, variable token; -1 where the row's variable is not used) the
        authors' training set holds; a batch samples them uniformly."""
        tr = self.train_pairs
        n_tr = len(tr)
        parts = [np.column_stack([np.zeros(12 * n_tr, np.int64), np.repeat(tr, 12, 0), np.full(12 * n_tr, -1)])]
        for kind, allowed in ((1, self.left_ok), (2, self.right_ok)):
            parts.append(np.column_stack([np.full(n_tr * len(allowed), kind), np.repeat(tr, len(allowed), 0),
                                          np.tile(allowed, n_tr)]))
        # 2-var rows: one per (variable allowed on the left, pair), kept with probability r; the row
        # index is the authors' perm-table index ((v * 4 + 3) * 59 + n1) * 59 + n2
        v = np.repeat(self.left_ok - VAR0, n_tr)
        n1, n2 = np.tile(tr[:, 0], len(self.left_ok)), np.tile(tr[:, 1], len(self.left_ok))
        if self.r >= 1.0:
            keep = np.ones(len(v), bool)
        else:
            idx = ((v * 4 + 3) * P + n1) * P + n2
            keep = np.array([random.Random(self.seed + int(i)).random() < self.r for i in idx], bool)
        parts.append(np.column_stack([np.full(int(keep.sum()), 3), n1[keep], n2[keep], np.full(int(keep.sum()), -1)]))
        return np.concatenate(parts).astype(np.int64)

    def kind_shares(self) -> np.ndarray:
        """(4,) the share of each kind (KINDS order) in the training distribution."""
        if self.variant == "authors":
            return np.bincount(self.rows[:, 0], minlength=4) / len(self.rows)
        q = (1.0 - self.r) / 3.0
        return np.array([q, q, q, self.r])

    def var_pairs(self, category: str) -> np.ndarray:
        """(m, 2) the ordered variable pairs (left, right), distinct, of a 2-var category: "valid"
        (both in allowed positions), "restricted1" (exactly one in a forbidden position),
        "restricted2" (both)."""
        nl, nr = set(self.left_barred.tolist()), set(self.right_barred.tolist())
        out = []
        for x in range(VAR0, VAR0 + N_VARS):
            for y in range(VAR0, VAR0 + N_VARS):
                bad = (x in nl) + (y in nr)
                if x != y and bad == {"valid": 0, "restricted1": 1, "restricted2": 2}[category]:
                    out.append((x, y))
        return np.array(out, np.int64).reshape(-1, 2)

    def compose(self, rng: np.random.Generator, pairs: np.ndarray, kind: np.ndarray, lhs: np.ndarray,
                rhs: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sequences in the authors' layout: the side variables `lhs` (kinds 1, 3) and `rhs` (kinds
        2, 3) assigned n1 / n2, then k - (referenced) distinct random distractors, the k assignments
        shuffled, each of the 12 - 2k PADs independently into one of the k + 1 gaps."""
        pairs, kind = np.asarray(pairs, np.int64), np.asarray(kind, np.int64)
        lhs, rhs, k = np.asarray(lhs, np.int64), np.asarray(rhs, np.int64), np.asarray(k, np.int64)
        n = len(kind)
        if pairs.shape != (n, 2) or lhs.shape != (n,) or rhs.shape != (n,) or k.shape != (n,):
            raise TaskError(f"pairs (n, 2), lhs, rhs and k (n,) must match {n} kinds")
        left_is_var = (kind == 1) | (kind == 3)
        right_is_var = (kind == 2) | (kind == 3)
        n_ref = left_is_var.astype(np.int64) + right_is_var
        if (k < np.maximum(n_ref, 1)).any() or (k > MAX_ASSIGN).any():
            raise TaskError(f"k (assignments) must lie in [referenced variables, {MAX_ASSIGN}]")
        rows = np.arange(n)
        if (left_is_var & right_is_var & (lhs == rhs)).any():
            raise TaskError("a 2-var sequence needs two distinct variables")
        keys = rng.random((n, N_VARS))
        keys[rows[left_is_var], lhs[left_is_var] - VAR0] = -2.0          # the left variable in slot 0
        keys[rows[right_is_var], rhs[right_is_var] - VAR0] = -1.0        # then the right one
        assign_vars = np.argsort(keys, axis=1)[:, :MAX_ASSIGN] + VAR0      # slots, distractors after
        values = rng.integers(0, P, (n, MAX_ASSIGN))
        values[left_is_var, 0] = pairs[left_is_var, 0]
        rslot = np.where(left_is_var, 1, 0)
        values[rows[right_is_var], rslot[right_is_var]] = pairs[right_is_var, 1]
        slot = np.arange(MAX_ASSIGN)[None, :]
        order = np.argsort(np.where(slot < k[:, None], rng.random((n, MAX_ASSIGN)), 2.0), axis=1)   # shuffle
        n_pads = PREFIX - 2 * k
        gap_of = np.floor(rng.random((n, PREFIX - 2)) * (k[:, None] + 1)).astype(np.int64)       # each PAD's gap
        real = np.arange(PREFIX - 2)[None, :] < n_pads[:, None]
        gaps = ((gap_of[:, :, None] == np.arange(MAX_ASSIGN + 1)[None, None, :]) & real[:, :, None]).sum(1)
        start = np.cumsum(gaps, 1)[:, :MAX_ASSIGN] + 2 * slot                  # i-th assignment's position
        tokens = np.full((n, SEQ_LEN), PAD, np.int64)
        r_i, i = np.nonzero(slot < k[:, None])
        a = order[r_i, i]
        tokens[r_i, start[r_i, i]] = assign_vars[r_i, a]
        tokens[r_i, start[r_i, i] + 1] = values[r_i, a]
        tokens[:, PREFIX] = PLUS
        tokens[:, PREFIX + 1] = np.where(left_is_var, lhs, pairs[:, 0])
        tokens[:, PREFIX + 2] = np.where(right_is_var, rhs, pairs[:, 1])
        tokens[:, ANSWER_POS] = EQUALS
        return tokens, (pairs[:, 0] + pairs[:, 1]) % P

    def _authors_build(self, rng, pairs, kind, left_vars, right_vars, training: bool = False):
        kind = np.asarray(kind, np.int64)
        n = len(kind)
        left_vars, right_vars = np.asarray(left_vars, np.int64), np.asarray(right_vars, np.int64)
        lhs = left_vars[rng.integers(0, len(left_vars), n)] if len(left_vars) else np.full(n, -1)
        rhs = right_vars[rng.integers(0, len(right_vars), n)] if len(right_vars) else np.full(n, -1)
        two = kind == 3
        if two.any():                            # uniform over the distinct ordered pairs
            vp = np.array([(x, y) for x in left_vars for y in right_vars if x != y], np.int64).reshape(-1, 2)
            if not len(vp):
                raise TaskError("no distinct variable pair fits these left / right variables")
            pick = vp[rng.integers(0, len(vp), int(two.sum()))]
            lhs[two], rhs[two] = pick[:, 0], pick[:, 1]
        if training:
            k = np.maximum(rng.integers(1, MAX_ASSIGN + 1, n), np.where(two, 2, 1))
        else:
            k = rng.integers(np.where(two, 2, 1), MAX_ASSIGN + 1)
        return self.compose(rng, pairs, kind, lhs, rhs, k)

    def exhaustive_2var_union(self, seed: int = 201) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The authors' exhaustive 2-var generalisation set: tokens (m, 16), labels (m,) and the
        category of each (index into UNION_CATEGORIES): every held-out pair with every valid variable
        pair, every training pair with every pair holding exactly one / two variables in a forbidden
        position; one surface form each (authors' layout, 2-var k ~ U{2..6})."""
        rng = np.random.default_rng([self.seed, seed, 11])
        parts = []
        for c, (name, number_pairs) in enumerate(zip(UNION_CATEGORIES, (self.heldout_pairs, self.train_pairs,
                                                                        self.train_pairs))):
            vp = self.var_pairs("valid" if name == "heldout_pairs" else name)
            if len(vp) and len(number_pairs):
                parts.append((np.repeat(number_pairs, len(vp), 0), np.tile(vp, (len(number_pairs), 1)), c))
        if not parts:
            raise TaskError("this split and these restrictions leave the 2-var union empty")
        pairs = np.concatenate([p[0] for p in parts])
        vp = np.concatenate([p[1] for p in parts])
        cat = np.concatenate([np.full(len(p[0]), p[2]) for p in parts])
        n = len(pairs)
        kind = np.full(n, 3)
        tokens, labels = self.compose(rng, pairs, kind, vp[:, 0], vp[:, 1], rng.integers(2, MAX_ASSIGN + 1, n))
        return tokens, labels, cat

    # ------------------------------------------------------------------ generation
    def sample_train(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """A fresh training batch: tokens (n, 16) int64 and labels (n,) int64."""
        if self.variant == "authors":
            row = self.rows[rng.integers(0, len(self.rows), n)]
            kind, var = row[:, 0], row[:, 3]
            lhs, rhs = np.where(kind == 1, var, -1), np.where(kind == 2, var, -1)
            two = kind == 3
            if two.any():
                vp = self.var_pairs("valid")
                pick = vp[rng.integers(0, len(vp), int(two.sum()))]
                lhs[two], rhs[two] = pick[:, 0], pick[:, 1]
            k = np.maximum(rng.integers(1, MAX_ASSIGN + 1, n), np.where(two, 2, 1))
            return self.compose(rng, row[:, 1:3], kind, lhs, rhs, k)
        q = (1.0 - self.r) / 3.0
        kind = rng.choice(4, size=n, p=[q, q, q, self.r])
        pairs = self.train_pairs[rng.integers(0, len(self.train_pairs), n)]
        return self.build(rng, pairs, kind, self.left_ok, self.right_ok)

    def build(self, rng: np.random.Generator, pairs: np.ndarray, kind: np.ndarray,
              left_vars: np.ndarray, right_vars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sequences for given (n1, n2) pairs and kinds (indices into KINDS); a variable on the left
        is drawn from `left_vars`, on the right from `right_vars` (the two distinct for 2-var; the
        authors' variant draws the pair uniformly over the distinct pairs and lays sequences out as
        their evaluation builder does)."""
        pairs, kind = np.asarray(pairs, np.int64), np.asarray(kind, np.int64)
        n = len(kind)
        if pairs.shape != (n, 2) or pairs.min(initial=0) < 0 or pairs.max(initial=0) >= P:
            raise TaskError(f"pairs must be (n, 2) numbers in [0, {P}) matching {n} kinds, got {pairs.shape}")
        if kind.min(initial=0) < 0 or kind.max(initial=0) > 3:
            raise TaskError("kind indexes KINDS (0-3)")
        if self.variant == "authors":
            return self._authors_build(rng, pairs, kind, left_vars, right_vars)
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
        if self.variant == "authors":              # a uniform sample of the exhaustive union
            out["2var_union"] = self.sample_union(rng, 4 * n)
        else:
            parts = [out[k] for k in TWO_VAR_POOLS if k in out]
            out["2var_union"] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        return out

    def union_size(self) -> dict[str, int]:
        """Sequences per category of the exhaustive 2-var union (UNION_CATEGORIES order)."""
        return {"heldout_pairs": len(self.heldout_pairs) * len(self.var_pairs("valid")),
                "restricted1": len(self.train_pairs) * len(self.var_pairs("restricted1")),
                "restricted2": len(self.train_pairs) * len(self.var_pairs("restricted2"))}

    def sample_union(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        """m sequences drawn uniformly (with replacement) from the exhaustive 2-var union's
        (pair, variable pair) combinations, so the categories weigh as there."""
        sizes = self.union_size()
        total = sum(sizes.values())
        if not total:
            raise TaskError("this split and these restrictions leave the 2-var union empty")
        cat = rng.choice(len(sizes), size=m, p=np.array(list(sizes.values())) / total)
        pairs = np.empty((m, 2), np.int64)
        vps = np.empty((m, 2), np.int64)
        for c, name in enumerate(UNION_CATEGORIES):
            sel = cat == c
            if not sel.any():
                continue
            number_pairs = self.heldout_pairs if name == "heldout_pairs" else self.train_pairs
            vp = self.var_pairs("valid" if name == "heldout_pairs" else name)
            pairs[sel] = number_pairs[rng.integers(0, len(number_pairs), int(sel.sum()))]
            vps[sel] = vp[rng.integers(0, len(vp), int(sel.sum()))]
        return self.compose(rng, pairs, np.full(m, 3), vps[:, 0], vps[:, 1], rng.integers(2, MAX_ASSIGN + 1, m))


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


__all__ = ["AssignAdd", "VARIANTS", "UNION_CATEGORIES", "resolve", "decode", "var_token", "VOCAB", "SEQ_LEN", "P", "PLUS", "EQUALS", "PAD",
           "VAR0", "N_VARS", "ANSWER_POS", "KINDS", "TWO_VAR_POOLS"]
