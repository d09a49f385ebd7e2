"""Next-token training of a token transformer on a synthetic stream (enough to give scans a
trained model; the studies bring their own data)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from wtc.models.training import TrainConfig, train
from wtc import arguments
from wtc.errors import ArgumentError

MAX_VOCAB = 16384


class MarkovSource:
    """Sequences from a random sparse Markov chain: each token has `branching` successors with
    Dirichlet weights, so a trained model has real structure to find."""

    def __init__(self, vocab: int, seq_len: int, branching: int = 3, seed: int = 0):
        for name, v in (("vocab", vocab), ("seq_len", seq_len), ("branching", branching)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise ArgumentError(f"MarkovSource {name} must be an int, got {v!r}")
        if vocab < 2 or seq_len < 2 or not 1 <= branching <= vocab:
            raise ArgumentError(f"MarkovSource needs vocab >= 2, seq_len >= 2, 1 <= branching <= vocab; "
                             f"got {vocab}, {seq_len}, {branching}")
        if vocab > MAX_VOCAB:            # the transition matrix is vocab x vocab float64
            raise ArgumentError(f"MarkovSource vocab must be at most {MAX_VOCAB} (its {vocab} x {vocab} transition "
                                f"matrix would need {8 * vocab ** 2 / 2**30:.3g} GiB), got {vocab}")
        self.seed = arguments.seed(seed, error=ArgumentError)
        rng = np.random.default_rng(self.seed)
        self.vocab, self.seq_len, self.branching = vocab, seq_len, branching
        self.P = np.zeros((vocab, vocab))
        for v in range(vocab):
            succ = rng.choice(vocab, branching, replace=False)
            self.P[v, succ] = rng.dirichlet(np.ones(branching))
        self.cum = self.P.cumsum(1)

    def sample(self, rng: np.random.Generator, n: int) -> torch.Tensor:
        out = np.empty((n, self.seq_len), np.int64)
        out[:, 0] = rng.integers(0, self.vocab, n)
        for t in range(1, self.seq_len):
            u = rng.random(n)[:, None]
            out[:, t] = np.minimum((u > self.cum[out[:, t - 1]]).sum(1), self.vocab - 1)
        return torch.from_numpy(out)


def next_token_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of every position's prediction of the next token (tokens (B, T))."""
    logits = model(tokens)                                           # (B, T, V)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def train_lm(model, source: MarkovSource, steps: int, batch: int = 64, lr: float = 1e-3, seed: int = 0,
             progress: bool = True, path=None) -> list[float]:
    """AdamW (weight decay 0.01) on next-token cross-entropy; returns the loss curve (over every
    call, when resumed). Batches come from one numpy Generator seeded by `seed`, drawn in order
    (wtc.models.training). path: the training state (wtc.models.training's checkpoints: at the
    start, every minute, on Ctrl-C / SIGTERM, at the end); a rerun with the same settings resumes
    it (`steps` may grow), other settings are refused by name."""
    if steps < 0 or batch < 1:
        raise ArgumentError(f"steps must be >= 0 and batch >= 1, got {steps}, {batch}")
    rng = np.random.default_rng(seed)
    identity = {"source": "markov", "vocab": int(source.vocab), "seq_len": int(source.seq_len),
                "branching": int(source.branching), "source_seed": source.seed, "batch": int(batch), "seed": int(seed)}
    result = train(model, TrainConfig(steps=steps, lr=lr, weight_decay=0.01), lambda step: source.sample(rng, batch),
                   lambda tokens: next_token_loss(model, tokens), rngs={"batch": rng}, progress=progress,
                   desc="lm train", path=path, identity=identity)
    model.train_seconds = result.seconds
    return result.losses
