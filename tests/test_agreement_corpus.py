"""wtc.tasks.agreement: the agreement corpus (determinism, number labels, held-out structure), on the
uniform variant (every noun of definite number; the graded variant's own properties:
tests/test_agreement_graded.py), and what holds for both."""
import numpy as np
import pytest
import torch

from wtc.tasks.agreement import (MODIFIERS, NOUNS, SETS, VARIANTS, VOCAB, AgreementCorpus, AgreementError,
                                 Sentence, labels)

NOUN_NUMBER = {w: (lemma, num) for lemma, pair in enumerate(NOUNS) for num, w in enumerate(pair)}


def nouns_between(s: Sentence):
    """(lemma, number) of the nouns after the subject and before the verb."""
    subject_at = s.verb_index - s.distance - 1
    return [NOUN_NUMBER[w] for w in s.words[subject_at + 1: s.verb_index] if w in NOUN_NUMBER]


def uniform(seed=0):
    return AgreementCorpus(seed, variant="uniform")


@pytest.mark.parametrize("variant", VARIANTS)
def test_vocabulary_is_a_few_hundred_unique_words(variant):
    assert 200 <= len(VOCAB) <= 400 and len(set(VOCAB)) == len(VOCAB)
    c = AgreementCorpus(variant=variant)
    assert 200 <= c.d_vocab <= 400 and len(set(c.vocab)) == c.d_vocab
    assert c.decode(c.encode("the keys near the cabinet are old .")) == "the keys near the cabinet are old .".split()
    assert c.encode("qwerty") == [c.ids["<unk>"]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_same_seed_same_data_other_seed_other_holdout(variant):
    a, b, c = (AgreementCorpus(s, variant=variant) for s in (3, 3, 4))
    assert torch.equal(a.stream(300, seed=5), b.stream(300, seed=5))
    assert not torch.equal(a.stream(300, seed=5), a.stream(300, seed=6))
    assert [s.text for s in a.eval_set("attractor", 50)] == [s.text for s in b.eval_set("attractor", 50)]
    assert torch.equal(a.windows(a.eval_set("attractor", 20), 16), b.windows(b.eval_set("attractor", 20), 16))
    assert not np.array_equal(a.held_noun_pairs, c.held_noun_pairs)


@pytest.mark.parametrize("name", SETS)
def test_number_labels_and_attractors_are_what_the_words_say(name):
    c = uniform()
    sents = c.eval_set(name, 400)
    assert labels(sents).tolist() == [i % 2 for i in range(400)]
    for s in sents:
        subject = s.words[s.verb_index - s.distance - 1]
        assert NOUN_NUMBER[subject] == (s.subject, s.number)
        assert c.number_of(s.words[s.verb_index]) == s.number           # the main verb agrees
        between = nouns_between(s)
        assert len(between) == s.nouns
        if name == "attractor":
            assert s.modifier != "none" and between and all(n != s.number for _, n in between)
        else:
            assert all(n == s.number for _, n in between)
    if name == "no_attractor":
        assert {s.modifier for s in sents} == set(MODIFIERS)


def test_training_sentences_agree_and_avoid_held_out_pairs():
    c = uniform()
    rng = np.random.default_rng(0)
    kinds = set()
    for s in c.sentences(rng, 3000):
        kinds.add(s.verb_kind)
        subject = s.words[s.verb_index - s.distance - 1]
        assert NOUN_NUMBER[subject] == (s.subject, s.number)
        if s.verb_kind != "past":
            assert c.number_of(s.words[s.verb_index]) == s.number
        else:
            assert c.number_of(s.words[s.verb_index]) is None
        between = nouns_between(s)
        assert not any(c.held_noun_pairs[s.subject, lemma] for lemma, _ in between)
        if not between:
            assert not c.held_verb_pairs[s.subject, s.verb]
    assert kinds == {"be_present", "be_past", "have", "regular", "past"}


def test_held_out_sentences_never_occur_in_training():
    c = uniform()
    train = {s.text for s in c.sentences(np.random.default_rng(1), 20000)}
    for name in SETS:
        held = c.eval_set(name, 500)
        assert not train & {s.text for s in held}
        for s in held:                           # each holds a held-out pair
            between = nouns_between(s)
            assert c.held_noun_pairs[s.subject, between[0][0]] if between else c.held_verb_pairs[s.subject, s.verb]


@pytest.mark.parametrize("variant", VARIANTS)
def test_distance_sets_and_windows(variant):
    c = AgreementCorpus(variant=variant)
    for d in (3, 4, 6):
        assert {s.distance for s in c.eval_set("attractor", 30, distance=d)} == {d}
    sents = c.eval_set("attractor", 40)
    w = c.windows(sents, 24)
    assert w.shape == (40, 24)
    for row, s in zip(w, sents):
        words = c.decode(row)
        assert tuple(words[-len(s.prefix):]) == s.prefix           # ends just before the verb
        assert words[-len(s.prefix) - 1] == "."                   # after whole training sentences
    with pytest.raises(AgreementError, match="distance"):
        c.eval_set("attractor", 5, distance=1)
    with pytest.raises(AgreementError, match="evaluation set"):
        c.eval_set("attractors", 5)
    with pytest.raises(AgreementError, match="modifier"):
        c.eval_set("attractor", 5, modifier="none")
