"""Subject-verb number agreement: a seeded generator of English-like sentences, a word-level
tokenizer, and held-out evaluation sets.

A sentence is  SUBJECT [MODIFIER] VERB [COMPLEMENT] .  with a subject noun phrase "the (adj) noun",
singular or plural, and a modifier of one of the kinds

    none      the key is old .
    pp        the key near the cabinets is old .                 (a prepositional phrase)
    pp2       the key near the cabinets of the men is old .       (two of them)
    rc_obj    the key that the men hold is old .                  (object relative clause; its verb
                                                                   agrees with its own subject)
    rc_subj   the key that opens the cabinets is old .            (subject relative clause)

whose nouns (attractors when their number differs from the subject's) stand between the subject
and the verb. Verbs: is/are, was/were, has/have and 24 regular verbs in the present (-s / bare),
which mark number, and the number-neutral past (had, regular past forms). Vocabulary: 235 words.

Held-out structure (seeded by the corpus seed): 10% of the (subject noun, first modifier noun) pairs
and 10% of the (subject noun, verb) pairs are held out. Training sentences never contain a held-out
pair (neither a held-out subject/modifier-noun pair, nor, without a modifier, a held-out
subject/verb pair); evaluation sentences always do, so no evaluation sentence occurs in training,
and the evaluation sets test combinations never seen. Evaluation sentences always have a
number-marked main verb.

Evaluation sets (`AgreementCorpus.eval_set`): "attractor" (every modifier noun has the other number),
"no_attractor" (no modifier, or one whose nouns share the subject's number), either one restricted
to a modifier kind or to a distance (the number of words between the subject noun and the verb).
Two variants (`AgreementCorpus(variant=...)`): "graded", the default (wtc.tasks.agreement_graded: nouns
drawn with Zipf frequencies, and 15 number-ambiguous collective / invariant nouns, "team", "sheep",
..., whose verb number is drawn with a noun-specific probability; 257 words; its attractor and
no-attractor sets have subjects and modifier nouns of definite number, and a third set,
"ambiguous", has an ambiguous subject), and "uniform", the Session 7 corpus described above,
reproduced exactly for a seed (same words, ids, draws).

`windows` turns sentences into fixed-length token windows that end just before the verb, the
window filled on the left by training-distribution sentences (the models are trained on a stream
of sentences): the last position predicts the verb, and its label is the subject's number
(0 singular, 1 plural).
"""
from __future__ import annotations

from functools import cached_property

import numpy as np
import torch

from wtc.tasks.agreement_words import (  # noqa: F401 (public names of this module)
    AgreementError, NOUNS, ADJECTIVES, PREPOSITIONS, VERBS, BE_PRESENT, BE_PAST, HAVE, END, UNK,
    THE, THAT, MODIFIERS, TRAIN_MODIFIERS, VERB_KINDS, TRAIN_VERB_KINDS, MARKED, SETS, N_LEMMAS, Sentence, VOCAB)

VARIANTS = ("graded", "uniform")
DEFAULT_VARIANT = "graded"


class AgreementCorpus:
    """The generator (module doc). seed: which pairs are held out (and nothing else; every sample
    takes its own numpy Generator). holdout: the held-out share of each kind of pair. variant:
    "uniform" (the Session 7 corpus: nouns drawn uniformly, every noun of definite number) or
    "graded" (wtc.tasks.agreement_graded: Zipf noun frequencies and number-ambiguous nouns with a
    noun-specific P(plural verb))."""

    def __init__(self, seed: int = 0, holdout: float = 0.1, adjective_p: float = 0.25, variant: str = DEFAULT_VARIANT):
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise AgreementError(f"seed must be a non-negative int, got {seed!r}")
        if not isinstance(holdout, (int, float)) or not 0 < holdout < 0.5:
            raise AgreementError(f"holdout must be a share in (0, 0.5), got {holdout!r}")
        if variant not in VARIANTS:
            raise AgreementError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        self.seed, self.holdout, self.adjective_p, self.variant = seed, float(holdout), float(adjective_p), variant
        self.vocab = list(VOCAB)
        self.n_definite = len(NOUNS)
        if variant == "graded":
            from wtc.tasks import agreement_graded as G
            self.nouns, self.prior, self.noun_weights = G.tables(NOUNS)
            self.vocab += G.new_words(NOUNS)
        else:
            self.nouns, self.noun_weights = list(NOUNS), None
            self.prior = np.array([[0.0, 1.0]] * len(NOUNS))
        self.ids = {w: i for i, w in enumerate(self.vocab)}
        rng = np.random.default_rng([seed, 7129])
        n = len(self.nouns)
        pairs = rng.random((n, n)) < holdout
        np.fill_diagonal(pairs, False)
        for s in range(n):                       # every subject has held-out partners of both kinds
            if not pairs[s, :self.n_definite].any():     # (a definite noun among them: evaluation modifiers are)
                pairs[s, (s + 1 + rng.integers(self.n_definite - 1)) % self.n_definite] = True
        verbs = rng.random((n, N_LEMMAS)) < holdout
        for s in range(n):
            if not verbs[s].any():
                verbs[s, rng.integers(N_LEMMAS)] = True
        self.held_noun_pairs = pairs             # [subject, modifier noun]
        self.held_verb_pairs = verbs             # [subject, verb lemma]

    # ------------------------------------------------------------------ words and ids

    @property
    def d_vocab(self) -> int:
        return len(self.vocab)

    def encode(self, words) -> list[int]:
        """Ids of words (a list, or a whitespace-separated string); unknown words are <unk>."""
        if isinstance(words, str):
            words = words.split()
        unk = self.ids[UNK]
        return [self.ids.get(w, unk) for w in words]

    def decode(self, ids) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    @cached_property
    def verb_forms(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(singular forms, plural forms) of the number-marked verbs, in matching order."""
        sing = [BE_PRESENT[0], BE_PAST[0], HAVE[0]] + [v[1] for v in VERBS]
        plur = [BE_PRESENT[1], BE_PAST[1], HAVE[1]] + [v[0] for v in VERBS]
        return tuple(sing), tuple(plur)

    def number_of(self, word: str) -> int | None:
        """0 / 1 for a singular / plural verb form, None for any other word."""
        sing, plur = self.verb_forms
        return 0 if word in sing else 1 if word in plur else None

    # ------------------------------------------------------------------ sentences

    def _np(self, rng, lemma: int, number: int) -> list[str]:
        words = [THE]
        if rng.random() < self.adjective_p:
            words.append(ADJECTIVES[rng.integers(len(ADJECTIVES))])
        return words + [NOUNS[lemma][number]]

    def _verb(self, rng, lemma: int, number: int, kind: str) -> list[str]:
        """Main verb (and complement) of a subject of `number`, of verb lemma `lemma`."""
        if kind in ("be_present", "be_past"):
            form = (BE_PRESENT if kind == "be_present" else BE_PAST)[number]
            if rng.random() < 0.5:
                return [form, ADJECTIVES[rng.integers(len(ADJECTIVES))]]
            return [form, PREPOSITIONS[rng.integers(len(PREPOSITIONS))]] + self._np(rng, rng.integers(len(NOUNS)),
                                                                                   rng.integers(2))
        obj = self._np(rng, rng.integers(len(NOUNS)), rng.integers(2))
        if kind == "have":
            return [HAVE[number]] + obj
        if lemma == 1:                             # have, number-neutral past
            return ["had"] + obj
        v = VERBS[lemma - 2]
        return [v[2] if kind == "past" else v[1 - number]] + obj

    def _rc_verb(self, rng, number: int) -> str:
        v = VERBS[rng.integers(len(VERBS))]
        return v[2] if rng.random() < 0.2 else v[1 - number]

    def _lemma_for(self, rng, kind: str, subject: int, held: bool | None) -> int:
        """A verb lemma for the verb kind; held=True: one held out with the subject, False: one not
        held out, None: any."""
        if kind in ("be_present", "be_past"):
            choices = [0]
        elif kind == "have":
            choices = [1]
        elif kind == "regular":
            choices = list(range(2, N_LEMMAS))
        else:
            choices = list(range(1, N_LEMMAS))
        if held is not None:
            choices = [c for c in choices if self.held_verb_pairs[subject, c] == held]
        return choices[rng.integers(len(choices))] if choices else -1

    def sentence(self, rng: np.random.Generator, *, split: str = "train", modifier: str | None = None,
                 number: int | None = None, attractor: bool | None = None, verb_kind: str | None = None,
                 subject: str | None = None) -> Sentence:
        """One sentence. split "train": no held-out pair; "eval": a held-out pair and a number-marked
        verb. modifier / number / verb_kind: fixed, or drawn (training shares); attractor: True every
        modifier noun has the other number, False the subject's, None each noun drawn. subject
        (graded corpus only): None drawn by frequency, "definite" / "ambiguous" a noun of that kind
        (wtc.tasks.agreement_graded.sentence)."""
        if subject is not None and (self.variant != "graded" or subject not in ("definite", "ambiguous")):
            raise AgreementError(f"subject={subject!r}: only the graded corpus has subject kinds ('definite', "
                                 f"'ambiguous'); this one is {self.variant!r}")
        if split not in ("train", "eval"):
            raise AgreementError(f"split must be 'train' or 'eval', got {split!r}")
        if modifier is not None and modifier not in MODIFIERS:
            raise AgreementError(f"modifier must be one of {', '.join(MODIFIERS)}, got {modifier!r}")
        if verb_kind is not None and verb_kind not in VERB_KINDS:
            raise AgreementError(f"verb_kind must be one of {', '.join(VERB_KINDS)}, got {verb_kind!r}")
        if split == "eval" and verb_kind == "past":
            raise AgreementError("evaluation sentences have a number-marked verb; verb_kind 'past' marks none")
        if self.variant == "graded":
            from wtc.tasks.agreement_graded import sentence
            return sentence(self, rng, split=split, modifier=modifier, number=number, attractor=attractor,
                            verb_kind=verb_kind, subject=subject)
        n = len(NOUNS)
        for _ in range(1000):
            mod = modifier or MODIFIERS[rng.choice(len(MODIFIERS), p=TRAIN_MODIFIERS)]
            num = int(rng.integers(2)) if number is None else int(number)
            if verb_kind is not None:
                vk = verb_kind
            elif split == "eval":
                vk = MARKED[rng.choice(len(MARKED), p=np.array(TRAIN_VERB_KINDS[:4]) / sum(TRAIN_VERB_KINDS[:4]))]
            else:
                vk = VERB_KINDS[rng.choice(len(VERB_KINDS), p=TRAIN_VERB_KINDS)]
            subj = int(rng.integers(n))
            n_mod = {"none": 0, "pp": 1, "pp2": 2, "rc_obj": 1, "rc_subj": 1}[mod]
            # modifier nouns: the first decides the held-out pair
            if n_mod and split == "eval":
                partners = np.flatnonzero(self.held_noun_pairs[subj])
                first = int(partners[rng.integers(len(partners))])
            elif n_mod:
                first = int(rng.integers(n))
                if self.held_noun_pairs[subj, first]:
                    continue
            mod_lemmas = [first] + [int(rng.integers(n)) for _ in range(n_mod - 1)] if n_mod else []
            if split == "train" and any(self.held_noun_pairs[subj, m] for m in mod_lemmas):
                continue
            mod_numbers = [(1 - num if attractor else num) if attractor is not None else int(rng.integers(2))
                           for _ in mod_lemmas]
            held = True if (split == "eval" and not n_mod) else (False if (split == "train" and not n_mod) else None)
            lemma = self._lemma_for(rng, vk, subj, held)
            if lemma < 0:
                continue
            words = self._np(rng, subj, num)
            subject_at = len(words) - 1
            if mod == "pp":
                words += [PREPOSITIONS[rng.integers(len(PREPOSITIONS))]] + self._np(rng, mod_lemmas[0], mod_numbers[0])
            elif mod == "pp2":
                for lem, nb in zip(mod_lemmas, mod_numbers):
                    words += [PREPOSITIONS[rng.integers(len(PREPOSITIONS))]] + self._np(rng, lem, nb)
            elif mod == "rc_obj":
                words += [THAT] + self._np(rng, mod_lemmas[0], mod_numbers[0]) + [self._rc_verb(rng, mod_numbers[0])]
            elif mod == "rc_subj":
                words += [THAT, self._rc_verb(rng, num)] + self._np(rng, mod_lemmas[0], mod_numbers[0])
            verb_at = len(words)
            words += self._verb(rng, lemma, num, vk) + [END]
            return Sentence(tuple(words), num, verb_at, mod, sum(nb != num for nb in mod_numbers), len(mod_lemmas),
                            verb_at - subject_at - 1, vk, subj, lemma)
        raise AgreementError(f"no {split} sentence with modifier={modifier}, verb_kind={verb_kind} in 1000 draws")

    def sentences(self, rng: np.random.Generator, n: int, **kw) -> list[Sentence]:
        return [self.sentence(rng, **kw) for _ in range(n)]

    def eval_set(self, name: str, n: int, seed: int = 1, modifier: str | None = None,
                 distance: int | None = None) -> list[Sentence]:
        """n held-out sentences, half singular and half plural subjects (module doc): name
        "attractor" (every modifier noun of the other number; modifier drawn among pp, pp2, rc_obj,
        rc_subj unless given) or "no_attractor" (modifier drawn among all kinds, nouns of the
        subject's number); distance: only sentences with that many words between subject and verb.
        In the graded corpus these two have subjects of definite number; its third set, "ambiguous",
        has a number-ambiguous subject (its verb's number drawn with the noun's probability, so not
        half and half), a modifier of any kind but "none" and modifier nouns of either number, and
        no other number evidence (a subject relative clause's verb is past tense)."""
        sets = SETS + (("ambiguous",) if self.variant == "graded" else ())
        if name not in sets:
            raise AgreementError(f"evaluation set must be one of {', '.join(sets)} (the {self.variant} corpus), "
                                 f"got {name!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise AgreementError(f"n must be a positive int, got {n!r}")
        with_modifier = name != "no_attractor"
        if modifier is not None and (modifier not in MODIFIERS or (with_modifier and modifier == "none")):
            raise AgreementError(f"modifier {modifier!r} is not one of the {name} set's "
                                 f"({', '.join(MODIFIERS[1:] if with_modifier else MODIFIERS)})")
        kinds = [modifier] if modifier else list(MODIFIERS[1:] if with_modifier else MODIFIERS)
        if distance is not None:
            kinds = [k for k in kinds if distance in _distances(k)]
            if not kinds:
                raise AgreementError(f"no {name} sentence has distance {distance} "
                                     f"(possible: {sorted(set().union(*(_distances(k) for k in MODIFIERS[1:])))})")
        rng = np.random.default_rng([self.seed, seed, 31337])
        out = []
        for i in range(n):
            if self.variant == "graded":
                kw = (dict(subject="ambiguous", attractor=None) if name == "ambiguous" else
                      dict(subject="definite", number=i % 2, attractor=name == "attractor"))
            else:
                kw = dict(number=i % 2, attractor=name == "attractor")
            for _ in range(1000):
                s = self.sentence(rng, split="eval", modifier=kinds[rng.integers(len(kinds))], **kw)
                if distance is None or s.distance == distance:
                    break
            else:
                raise AgreementError(f"no {name} sentence with distance {distance} in 1000 draws")
            out.append(s)
        return out

    @property
    def ambiguous_share(self) -> float:
        """The share of training sentences whose subject is a number-ambiguous form (0 in the uniform
        corpus): the frequency-weighted share of lemmas, a form drawn half and half."""
        if self.noun_weights is None:
            return 0.0
        amb = ((self.prior > 0) & (self.prior < 1)).mean(1)
        return float(self.noun_weights @ amb)

    # ------------------------------------------------------------------ token data

    def stream(self, n_sentences: int, seed: int = 0) -> torch.Tensor:
        """Token ids (N,) of n training sentences, one after another ("." ends each)."""
        rng = np.random.default_rng([self.seed, seed, 4242])
        ids = []
        for s in self.sentences(rng, n_sentences, split="train"):
            ids += self.encode(s.words)
        return torch.tensor(ids, dtype=torch.int64)

    def windows(self, sentences: list[Sentence], length: int, seed: int = 2, encode=None) -> torch.Tensor:
        """(n, length) token windows ending just before each sentence's main verb, filled on the left
        with training sentences (the same fill for the same seed). encode: text -> ids (default the
        corpus's word ids; a Hugging Face tokenizer's for a model with its own)."""
        if not isinstance(length, int) or length < 2:
            raise AgreementError(f"window length must be an int >= 2, got {length!r}")
        encode = encode or self.encode
        rng = np.random.default_rng([self.seed, seed, 999])
        rows = []
        for s in sentences:
            fill: list[str] = []
            ids = encode(" ".join(s.prefix))
            while True:
                if len(ids) >= length:
                    break
                fill = list(self.sentence(rng, split="train").words) + fill
                ids = encode(" ".join(fill + list(s.prefix)))
            rows.append(ids[-length:])
        return torch.tensor(rows, dtype=torch.int64)


def _distances(kind: str) -> set[int]:
    """Possible words between subject noun and verb for a modifier kind (adjectives optional)."""
    return {"none": {0}, "pp": {3, 4}, "pp2": {6, 7, 8}, "rc_obj": {4, 5}, "rc_subj": {4, 5}}[kind]


def labels(sentences: list[Sentence]) -> torch.Tensor:
    """Subject numbers (n,): 0 singular, 1 plural."""
    return torch.tensor([s.number for s in sentences], dtype=torch.int64)


__all__ = ["AgreementCorpus", "AgreementError", "Sentence", "VOCAB", "MODIFIERS", "VERB_KINDS", "SETS", "labels"]
