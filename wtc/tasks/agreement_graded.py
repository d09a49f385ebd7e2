"""The "graded" variant of the agreement corpus (wtc.tasks.agreement): graded number evidence.

The "uniform" corpus (Session 7) draws every noun with the same probability and every noun has a
definite number, so the only thing a model can learn about the verb's number is the subject's
(a deterministic target) and two models have no shared reason to order same-number sentences
alike. Natural English has graded number evidence; this variant adds two kinds of it:

- Noun frequencies: nouns (subjects, modifier and object nouns alike) are drawn with Zipf weights
  1 / rank ** ZIPF_S over a fixed frequency order (FREQUENCY_ORDER, a judgement of common English
  usage, not a measured count), instead of uniformly.
- Number-ambiguous nouns, whose verb number is a draw with a noun-specific probability p
  (AMBIGUOUS: P(plural verb)). Collective nouns ("team", "family", ...; "notional agreement":
  "the team is / are") have an ambiguous singular form and a definite plural form ("teams");
  invariant nouns ("sheep", "fish", "series", "police", ...) have one form for both numbers. Each
  occurrence of an ambiguous form gets a hidden number (plural with probability p) and every verb
  that agrees with that noun phrase follows it: the main verb of its clause and, when present
  (and not past tense), the verb of a subject relative clause ("the sheep that eats the grass is"),
  which thereby disambiguates it, as in English. Without such evidence the best prediction of
  the verb's number is p itself: a graded prior that every model trained on the corpus must learn,
  from the same statistics.

The p values are stipulated (spanning 0.12-0.95, collectives mostly singular-leaning as in
American usage, "police" almost always plural), not measured from a corpus. Training labels are
otherwise grammatical: a noun with a definite number always takes its own number; there are no
attraction errors in the data.

Words and ids: the uniform corpus's 235 words keep their ids; the ambiguous nouns' forms follow.
"""
from __future__ import annotations

import numpy as np

ZIPF_S = 0.7
# (singular form, plural form, P(plural verb | the singular form)); invariant nouns: both forms the same word
AMBIGUOUS = [("government", "governments", 0.15), ("family", "families", 0.12), ("team", "teams", 0.25),
             ("committee", "committees", 0.30), ("couple", "couples", 0.55), ("audience", "audiences", 0.35),
             ("crew", "crews", 0.45),
             ("police", "police", 0.95), ("staff", "staff", 0.70), ("fish", "fish", 0.55), ("series", "series", 0.12),
             ("species", "species", 0.35), ("aircraft", "aircraft", 0.40), ("deer", "deer", 0.60),
             ("sheep", "sheep", 0.70)]
FREQUENCY_ORDER = """man child woman house friend book car door government family city school team police road tree
office teacher student doctor letter picture king window table phone dog staff river church player worker manager girl
boy customer officer horse bird garden fish village mountain computer chair bridge driver author committee couple lawyer
queen cat farmer box bottle key neighbor audience crew series species pilot singer painter aircraft deer sheep cabinet
lamp mouse""".split()


def tables(definite_nouns):
    """(nouns, prior, weights) for the graded corpus: nouns the (singular, plural) forms of each
    lemma (the definite ones first, in their order, then AMBIGUOUS); prior (n, 2): P(plural verb)
    of each lemma's singular and plural form (0 / 1 for a definite noun); weights (n,): the Zipf
    draw probabilities by FREQUENCY_ORDER."""
    nouns = list(definite_nouns) + [(s, p) for s, p, _ in AMBIGUOUS]
    prior = np.array([[0.0, 1.0]] * len(definite_nouns) + [[p, p if s == pl else 1.0] for s, pl, p in AMBIGUOUS])
    rank = {w: i for i, w in enumerate(FREQUENCY_ORDER)}
    if sorted(rank) != sorted(s for s, _ in nouns):
        raise AssertionError("FREQUENCY_ORDER must list every lemma's singular form once")
    w = np.array([1.0 / (rank[s] + 1) ** ZIPF_S for s, _ in nouns])
    return nouns, prior, w / w.sum()


def new_words(definite_nouns) -> list[str]:
    """The ambiguous nouns' forms, in order, each once."""
    seen = {w for pair in definite_nouns for w in pair}
    out = []
    for s, p, _ in AMBIGUOUS:
        for w in (s, p):
            if w not in seen:
                seen.add(w)
                out.append(w)
    return out


def sentence(c, rng: np.random.Generator, *, split: str, modifier: str | None, number: int | None,
             attractor: bool | None, verb_kind: str | None, subject: str | None):
    """One sentence of the graded corpus c (AgreementCorpus.sentence's arguments; the same held-out
    structure). subject: None a lemma drawn by frequency (training), "definite" one of the definite
    nouns, uniformly (its form the number asked for), "ambiguous" the ambiguous form of one of the
    AMBIGUOUS nouns, uniformly. Evaluation sentences' modifier nouns are definite nouns (an attractor
    has the other number), and a subject relative clause after an ambiguous evaluation subject has a
    past-tense verb (so that nothing but the prior tells the subject's number)."""
    from wtc.tasks import agreement_words as A

    n, n_def = len(c.nouns), c.n_definite
    w = c.noun_weights

    def lemma_by_frequency():
        return int(rng.choice(n, p=w))

    def latent(lemma, form):
        p = c.prior[lemma, form]
        return int(form if p in (0.0, 1.0) else rng.random() < p)

    def np_(lemma, form):
        words = [A.THE]
        if rng.random() < c.adjective_p:
            words.append(A.ADJECTIVES[rng.integers(len(A.ADJECTIVES))])
        return words + [c.nouns[lemma][form]]

    def verb(lemma, num, kind):
        if kind in ("be_present", "be_past"):
            form = (A.BE_PRESENT if kind == "be_present" else A.BE_PAST)[num]
            if rng.random() < 0.5:
                return [form, A.ADJECTIVES[rng.integers(len(A.ADJECTIVES))]]
            return [form, A.PREPOSITIONS[rng.integers(len(A.PREPOSITIONS))]] + np_(lemma_by_frequency(), rng.integers(2))
        obj = np_(lemma_by_frequency(), rng.integers(2))
        if kind == "have":
            return [A.HAVE[num]] + obj
        if lemma == 1:
            return ["had"] + obj
        v = A.VERBS[lemma - 2]
        return [v[2] if kind == "past" else v[1 - num]] + obj

    def rc_verb(num, past=False):
        v = A.VERBS[rng.integers(len(A.VERBS))]
        return v[2] if past or rng.random() < 0.2 else v[1 - num]

    for _ in range(1000):
        mod = modifier or A.MODIFIERS[rng.choice(len(A.MODIFIERS), p=A.TRAIN_MODIFIERS)]
        if verb_kind is not None:
            vk = verb_kind
        elif split == "eval":
            vk = A.MARKED[rng.choice(len(A.MARKED), p=np.array(A.TRAIN_VERB_KINDS[:4]) / sum(A.TRAIN_VERB_KINDS[:4]))]
        else:
            vk = A.VERB_KINDS[rng.choice(len(A.VERB_KINDS), p=A.TRAIN_VERB_KINDS)]
        if subject is None:
            subj, form = lemma_by_frequency(), int(rng.integers(2)) if number is None else int(number)
        elif subject == "definite":
            subj, form = int(rng.integers(n_def)), int(rng.integers(2)) if number is None else int(number)
        else:
            subj, form = n_def + int(rng.integers(n - n_def)), 0
        num = latent(subj, form)
        ambiguous = 0.0 < c.prior[subj, form] < 1.0
        n_mod = {"none": 0, "pp": 1, "pp2": 2, "rc_obj": 1, "rc_subj": 1}[mod]
        if n_mod and split == "eval":
            partners = np.flatnonzero(c.held_noun_pairs[subj, :n_def])
            mod_lemmas = [int(partners[rng.integers(len(partners))])] + [int(rng.integers(n_def)) for _ in range(n_mod - 1)]
        elif n_mod:
            mod_lemmas = [lemma_by_frequency() for _ in range(n_mod)]
            if any(c.held_noun_pairs[subj, m] for m in mod_lemmas):
                continue
        else:
            mod_lemmas = []
        if attractor is None:
            mod_forms = [int(rng.integers(2)) for _ in mod_lemmas]
        else:
            mod_forms = [1 - num if attractor else num for _ in mod_lemmas]
        mod_numbers = [latent(m, f) for m, f in zip(mod_lemmas, mod_forms)]
        held = True if (split == "eval" and not n_mod) else (False if (split == "train" and not n_mod) else None)
        lemma = c._lemma_for(rng, vk, subj, held)
        if lemma < 0:
            continue
        words = np_(subj, form)
        subject_at = len(words) - 1
        if mod in ("pp", "pp2"):
            for lem, f in zip(mod_lemmas, mod_forms):
                words += [A.PREPOSITIONS[rng.integers(len(A.PREPOSITIONS))]] + np_(lem, f)
        elif mod == "rc_obj":
            words += [A.THAT] + np_(mod_lemmas[0], mod_forms[0]) + [rc_verb(mod_numbers[0])]
        elif mod == "rc_subj":
            words += [A.THAT, rc_verb(num, past=split == "eval" and ambiguous)] + np_(mod_lemmas[0], mod_forms[0])
        verb_at = len(words)
        words += verb(lemma, num, vk) + [A.END]
        return A.Sentence(tuple(words), num, verb_at, mod, sum(nb != num for nb in mod_numbers), len(mod_lemmas),
                          verb_at - subject_at - 1, vk, subj, lemma,
                          float(c.prior[subj, form]) if ambiguous else None)
    raise A.AgreementError(f"no {split} sentence with modifier={modifier}, verb_kind={verb_kind} in 1000 draws")
