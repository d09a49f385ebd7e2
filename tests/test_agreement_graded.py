"""wtc.tasks.agreement's variants: "uniform" is the Session 7 corpus exactly; "graded" has Zipf noun
frequencies and number-ambiguous nouns whose verb number is drawn with the noun's probability."""
import hashlib
import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from wtc.tasks.agreement import NOUNS, VOCAB, AgreementCorpus, AgreementError
from wtc.tasks.agreement_graded import AMBIGUOUS, FREQUENCY_ORDER, ZIPF_S


def _h(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:16]


# fingerprints of the corpus as it was before the variants existed (commit 00b8963), per corpus seed:
# stream(500, seed=1) ids, eval_set attractor 100, no_attractor 100 (seed 5), attractor distance 4,
# windows of 20 attractor sentences, the study's sentence_batch(300, 24, 0), the vocabulary, the held-out pairs
SESSION7 = {0: ("2b3a6d0998fd7205", "6da033518b1b004a", "699d6404a7777106", "ec5202911d7aaf12", "dfaf18eb792fcb6f",
                "92a02ff618458e9c", "c1a7af7d30352c5a", "d9e7f5ce44aa6758"),
            3: ("63a375ae55e4c3c0", "be5417c0eec9993f", "b644b95bbe973dcb", "1165eb211d6de5ec", "9ad0a5f51a18e813",
                "79cd9d1d53ab01d9", "c1a7af7d30352c5a", "8a28a680015f3997")}


@pytest.mark.parametrize("seed", sorted(SESSION7))
def test_the_uniform_variant_is_the_session7_corpus_exactly(seed):
    from wtc.studies.agreement import sentence_batch

    c = AgreementCorpus(seed, variant="uniform")
    got = (_h(" ".join(map(str, c.stream(500, seed=1).tolist()))),
           _h("\n".join(s.text for s in c.eval_set("attractor", 100))),
           _h("\n".join(s.text for s in c.eval_set("no_attractor", 100, seed=5))),
           _h("\n".join(s.text for s in c.eval_set("attractor", 30, distance=4))),
           _h(" ".join(map(str, c.windows(c.eval_set("attractor", 20), 24).flatten().tolist()))),
           _h(" ".join(map(str, sentence_batch(c, 300, 24, 0)[0].flatten().tolist()))),
           _h(" ".join(c.vocab)), _h(str(c.held_noun_pairs.tolist()) + str(c.held_verb_pairs.tolist())))
    assert got == SESSION7[seed]
    assert c.ambiguous_share == 0.0 and all(s.p_plural is None for s in c.sentences(np.random.default_rng(0), 200))
    with pytest.raises(AgreementError, match="ambiguous"):
        c.eval_set("ambiguous", 5)
    with pytest.raises(AgreementError, match="only the graded corpus"):
        c.sentence(np.random.default_rng(0), subject="ambiguous")
    with pytest.raises(AgreementError, match="variant"):
        AgreementCorpus(0, variant="english")


def graded():
    return AgreementCorpus(0, variant="graded")


def forms(c):
    """word -> (lemma, P(plural verb) of the form)"""
    return {w: (lemma, float(c.prior[lemma, f])) for lemma, pair in enumerate(c.nouns) for f, w in enumerate(pair)}


def subject_word(s):
    return s.words[s.verb_index - s.distance - 1]


def test_graded_vocabulary_keeps_the_uniform_ids_and_adds_the_ambiguous_nouns():
    c = graded()
    assert c.vocab[:len(VOCAB)] == VOCAB and len(set(c.vocab)) == len(c.vocab)
    assert {w for s, p, _ in AMBIGUOUS for w in (s, p)} == set(c.vocab[len(VOCAB):])
    assert sorted(FREQUENCY_ORDER) == sorted(s for s, _ in c.nouns) and len(c.nouns) == len(NOUNS) + len(AMBIGUOUS)
    f = forms(c)
    for s, p, q in AMBIGUOUS:                    # collective: plural form definite; invariant: one form
        assert f[s][1] == q and f[p][1] == (q if s == p else 1.0)
    for s, p in NOUNS:
        assert f[s][1] == 0.0 and f[p][1] == 1.0


def test_ambiguous_nouns_take_a_plural_verb_with_their_probability():
    """Training sentences whose subject is an ambiguous form and whose main verb marks number: the
    plural share per noun is its p within a 4.5-sigma binomial bound; definite nouns always agree."""
    c = graded()
    f = forms(c)
    counts = defaultdict(lambda: [0, 0])
    for s in c.sentences(np.random.default_rng(5), 40000):
        word = subject_word(s)
        lemma, p = f[word]
        assert s.subject == lemma
        if s.verb_kind == "past":
            assert c.number_of(s.words[s.verb_index]) is None
            continue
        assert c.number_of(s.words[s.verb_index]) == s.number
        if p in (0.0, 1.0):
            assert s.number == int(p) and s.p_plural is None
        else:
            assert s.p_plural == p
            counts[word][0] += s.number
            counts[word][1] += 1
        if s.modifier == "rc_subj":              # the relative clause's verb follows the same number
            rc = c.number_of(s.words[s.verb_index - s.distance + 1])      # subject, "that", the verb
            assert rc in (None, s.number)
    ambiguous_forms = {w for w, (_, p) in f.items() if 0 < p < 1}
    assert set(counts) == ambiguous_forms
    for word, (k, n) in counts.items():
        p = f[word][1]
        assert n >= 50 and abs(k / n - p) <= 4.5 * math.sqrt(p * (1 - p) / n), (word, k, n, p)


def test_graded_nouns_follow_their_zipf_frequencies_and_the_ambiguous_share():
    c = graded()
    sents = c.sentences(np.random.default_rng(6), 20000)
    got = Counter(s.subject for s in sents)
    rank = {w: i for i, w in enumerate(FREQUENCY_ORDER)}
    w = np.array([1 / (rank[s] + 1) ** ZIPF_S for s, _ in c.nouns])
    w /= w.sum()
    assert np.allclose(c.noun_weights, w)
    obs = np.array([got[i] for i in range(len(c.nouns))])
    chi2 = float((((obs - len(sents) * w) ** 2) / (len(sents) * w)).sum())
    assert chi2 < len(w) + 5 * math.sqrt(2 * len(w))          # df = 70: mean 70, sd 11.8
    share = np.mean([s.p_plural is not None for s in sents])
    assert abs(share - c.ambiguous_share) <= 4.5 * math.sqrt(c.ambiguous_share * (1 - c.ambiguous_share) / len(sents))
    assert 0.05 < c.ambiguous_share < 0.2


def test_graded_evaluation_sets():
    c = graded()
    f = forms(c)
    train = {s.text for s in c.sentences(np.random.default_rng(1), 20000)}
    for name in ("attractor", "no_attractor", "ambiguous"):
        held = c.eval_set(name, 300)
        assert not train & {s.text for s in held}
        for s in held:
            lemma, p = f[subject_word(s)]
            assert c.number_of(s.words[s.verb_index]) == s.number
            between = [f[w] for w in s.words[s.verb_index - s.distance: s.verb_index] if w in f]
            assert len(between) == s.nouns and all(q in (0.0, 1.0) for _, q in between)   # definite modifier nouns
            assert c.held_noun_pairs[lemma, between[0][0]] if between else c.held_verb_pairs[lemma, s.verb]
            if name == "ambiguous":
                assert 0 < p < 1 and s.p_plural == p and s.modifier != "none"
                # no number evidence but the prior: a verb before the main one agrees with its own
                # subject (an object relative clause's noun) or is past tense
                marked = [w for w in s.prefix if c.number_of(w) is not None]
                assert not marked or (s.modifier == "rc_obj" and marked == [s.prefix[-1]]
                                      and c.number_of(marked[0]) == int(between[0][1]))
            else:
                assert p == s.number and s.p_plural is None
                assert all(int(q) != s.number for _, q in between) if name == "attractor" else \
                    all(int(q) == s.number for _, q in between)
        if name != "ambiguous":
            assert [s.number for s in held] == [i % 2 for i in range(300)]
    amb = c.eval_set("ambiguous", 600)
    k = Counter((s.p_plural, s.number) for s in amb)
    assert {p for p, _ in k} == {q for _, _, q in AMBIGUOUS}
    assert {s.distance for s in c.eval_set("ambiguous", 30, distance=4)} == {4}
