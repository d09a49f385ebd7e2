"""The agreement corpus's words and sentence record, shared by both variants (wtc.tasks.agreement,
the uniform draw, and wtc.tasks.agreement_graded), so that neither imports the other's module."""
from __future__ import annotations

from dataclasses import dataclass

from wtc.errors import WtcError


class AgreementError(WtcError, ValueError):
    """An agreement-corpus request that cannot be met (unknown set or kind, bad sizes)."""


NOUNS = [("key", "keys"), ("cabinet", "cabinets"), ("dog", "dogs"), ("cat", "cats"), ("boy", "boys"),
         ("girl", "girls"), ("man", "men"), ("woman", "women"), ("child", "children"), ("teacher", "teachers"),
         ("student", "students"), ("doctor", "doctors"), ("farmer", "farmers"), ("author", "authors"),
         ("pilot", "pilots"), ("driver", "drivers"), ("singer", "singers"), ("painter", "painters"),
         ("lawyer", "lawyers"), ("officer", "officers"), ("king", "kings"), ("queen", "queens"),
         ("friend", "friends"), ("neighbor", "neighbors"), ("customer", "customers"), ("manager", "managers"),
         ("player", "players"), ("worker", "workers"), ("book", "books"), ("table", "tables"), ("chair", "chairs"),
         ("door", "doors"), ("window", "windows"), ("car", "cars"), ("house", "houses"), ("garden", "gardens"),
         ("tree", "trees"), ("box", "boxes"), ("letter", "letters"), ("picture", "pictures"),
         ("bottle", "bottles"), ("lamp", "lamps"), ("phone", "phones"), ("computer", "computers"),
         ("road", "roads"), ("bridge", "bridges"), ("river", "rivers"), ("mountain", "mountains"),
         ("city", "cities"), ("village", "villages"), ("church", "churches"), ("school", "schools"),
         ("office", "offices"), ("bird", "birds"), ("horse", "horses"), ("mouse", "mice")]
ADJECTIVES = ["old", "new", "small", "big", "red", "blue", "green", "young", "tall", "short", "happy", "sad",
              "quiet", "loud", "famous", "rich", "poor", "strange", "heavy", "bright", "dark", "shiny", "dirty",
              "warm", "cold", "busy", "empty", "broken", "lucky", "angry"]
PREPOSITIONS = ["near", "behind", "beside", "under", "above", "with", "from", "for", "of", "by"]
# (plural / bare, singular, past)
VERBS = [("like", "likes", "liked"), ("see", "sees", "saw"), ("open", "opens", "opened"), ("help", "helps", "helped"),
         ("watch", "watches", "watched"), ("visit", "visits", "visited"), ("need", "needs", "needed"),
         ("love", "loves", "loved"), ("hate", "hates", "hated"), ("find", "finds", "found"),
         ("know", "knows", "knew"), ("want", "wants", "wanted"), ("carry", "carries", "carried"),
         ("follow", "follows", "followed"), ("remember", "remembers", "remembered"), ("call", "calls", "called"),
         ("paint", "paints", "painted"), ("build", "builds", "built"), ("clean", "cleans", "cleaned"),
         ("push", "pushes", "pushed"), ("pull", "pulls", "pulled"), ("hold", "holds", "held"),
         ("protect", "protects", "protected"), ("admire", "admires", "admired")]
BE_PRESENT, BE_PAST, HAVE = ("is", "are"), ("was", "were"), ("has", "have")
END, UNK, THE, THAT = ".", "<unk>", "the", "that"

MODIFIERS = ("none", "pp", "pp2", "rc_obj", "rc_subj")
TRAIN_MODIFIERS = (0.3, 0.3, 0.1, 0.15, 0.15)
# main-verb kinds: number-marked ones first
VERB_KINDS = ("be_present", "be_past", "have", "regular", "past")
TRAIN_VERB_KINDS = (0.25, 0.15, 0.15, 0.3, 0.15)
MARKED = VERB_KINDS[:4]
SETS = ("attractor", "no_attractor")
N_LEMMAS = 2 + len(VERBS)                      # be, have, the regular verbs (held-out subject/verb pairs)


@dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]       # ends with "."
    number: int                  # subject: 0 singular, 1 plural
    verb_index: int              # position of the main verb in words
    modifier: str                # one of MODIFIERS
    attractors: int              # modifier nouns of the other number (between subject and verb)
    nouns: int                   # modifier nouns
    distance: int                # words between the subject noun and the verb
    verb_kind: str               # one of VERB_KINDS
    subject: int                 # noun lemma index
    verb: int                    # verb lemma index (0 be, 1 have, 2.. VERBS)
    p_plural: float | None = None  # a number-ambiguous subject (graded corpus): P(plural verb); None: definite

    @property
    def text(self) -> str:
        return " ".join(self.words)

    @property
    def prefix(self) -> tuple[str, ...]:
        """The words before the main verb."""
        return self.words[: self.verb_index]


def _vocabulary() -> list[str]:
    words = [END, UNK, THE, THAT]
    words += [w for pair in NOUNS for w in pair] + ADJECTIVES + PREPOSITIONS
    words += list(BE_PRESENT) + list(BE_PAST) + list(HAVE) + ["had"]
    words += [w for triple in VERBS for w in triple]
    if len(set(words)) != len(words):
        dup = sorted({w for w in words if words.count(w) > 1})
        raise AssertionError(f"agreement vocabulary has duplicates: {dup}")
    return words


VOCAB = _vocabulary()
