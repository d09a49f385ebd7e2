"""Controls for the sparse-vs-dense study: models whose weights should not be interpretable.

- ``random``: the dense architecture at its initialisation (the same seed as the dense model),
  never trained. Whatever its weights do is an accident of the draw, not a learned mechanism.
- ``shuffled``: the dense architecture trained exactly like the dense model (same steps, batch,
  learning rate, seed, data order) on the same training bytes with their order shuffled within
  every block of ctx + 1 bytes (the length of one training sequence; the training windows start
  at random offsets, so a window spans at most two shuffled blocks).

Why shuffle the token order rather than permute the targets: a fixed permutation of the byte
vocabulary is a relabelling (the model learns the same structure, renamed), and targets drawn at
random leave nothing to learn but the unigram distribution, so the model would stay close to its
initialisation apart from the unembedding. Shuffling within sequences keeps what the data contain
(the byte frequencies, and which bytes occur together in a window, a bag-of-bytes signal the model
can and does learn) while destroying the order that every next-byte mechanism of real code relies
on. Its weights move as far as the dense model's, so it controls for "trained weights look
interpretable" as well as for "the score finds structure in the text itself".

Both are explained by exactly the pipeline of the sparse and dense models, on the same ordered
held-out text.
"""
from __future__ import annotations

import numpy as np

from wtc.errors import StudyError

CONTROLS = ("random", "shuffled")


def shuffle_within_blocks(tokens: np.ndarray, block: int, seed: int = 0) -> np.ndarray:
    """A copy of the 1-D `tokens` with the order permuted inside every consecutive block of `block`
    tokens (a last partial block too), independently per block, deterministic in `seed`. The
    multiset of tokens in each block is unchanged."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise StudyError(f"shuffle_within_blocks: tokens must be 1-D, got shape {tokens.shape}")
    if not isinstance(block, int) or isinstance(block, bool) or block < 2:
        raise StudyError(f"shuffle_within_blocks: block must be an int >= 2, got {block!r}")
    rng = np.random.default_rng([seed, 97])
    n_full = len(tokens) // block
    head = tokens[:n_full * block].reshape(n_full, block)
    keys = rng.random(head.shape)
    out = np.take_along_axis(head, np.argsort(keys, axis=1), axis=1).ravel()
    tail = tokens[n_full * block:]
    return np.concatenate([out, tail[rng.permutation(len(tail))]]).astype(tokens.dtype, copy=False)


__all__ = ["CONTROLS", "shuffle_within_blocks"]
