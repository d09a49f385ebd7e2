"""Second-order *estimate* of each weight's total KL: 1/2 w^2 F_ii (diagonal Fisher).

Zeroing weight w moves the parameters by delta = -w e_i, and KL(p || p_delta) = 1/2 delta^T F delta
+ O(|delta|^3). F_ii summed over positions is estimated without bias from per-sequence gradients
of sum_t log p(y_t) with labels y_t sampled from the model itself (cross-position terms vanish in
expectation because the y_t are drawn independently given the tokens). It is a pre-filter, cheap
(a few backward passes per sequence) and approximate: never stored with, or reported as, the exact
scan. Use it to pick which weights to scan exactly (scan(..., weights=mask)).
"""
from __future__ import annotations

import torch
from torch import nn


MAX_SAMPLES = 100_000


def fisher_estimate(model: nn.Module, tokens, params, readout=None, samples: int = 4,
                    seed: int = 0) -> dict[str, torch.Tensor]:
    """{name: 1/2 w^2 F_ii} shaped like each parameter (an estimate, float64)."""
    from wtc.scan.engine import _select_params

    from wtc import arguments
    from wtc.errors import ScanError
    from wtc.scan.inputs import as_tokens

    samples = arguments.positive_int(samples, "samples", ScanError)
    if samples > MAX_SAMPLES:         # one backward pass per sample and sequence: 10**9 never ends
        raise ScanError(f"samples must be a positive integer <= {MAX_SAMPLES} (label draws per sequence), got {samples}")
    seed = arguments.seed(seed, error=ScanError)
    if not (readout is None or callable(readout)):
        raise ScanError(f"readout must be a callable (model output -> logits) or None, got {type(readout).__name__}")
    user = readout
    readout = (lambda out: out) if user is None else (lambda out: arguments.float_readout(user, out, ScanError))
    tokens = as_tokens(tokens, model)
    chosen = _select_params(model, params)
    fisher = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in chosen.items()}
    gen = torch.Generator().manual_seed(seed)
    modes = [(m, m.training) for m in model.modules()]      # as scan: dropout would be noise here
    model.eval()
    try:
        _accumulate(model, tokens, chosen, fisher, readout, samples, gen)
    finally:
        for m, training in modes:
            m.training = training
    return {n: 0.5 * chosen[n].detach().double() ** 2 * f for n, f in fisher.items()}


def _accumulate(model, tokens, chosen, fisher, readout, samples, gen) -> None:
    from wtc.errors import ScanError

    for b in range(tokens.shape[0]):
        seq = tokens[b:b + 1]
        for _ in range(samples):
            logits = readout(model(seq))                                       # (1, T, V)
            if not torch.is_tensor(logits) or not logits.is_floating_point():
                raise ScanError(f"the model returns {type(logits).__name__}, not float logits: pass readout= "
                                "(output -> logits (B, T, V))")
            if not torch.isfinite(logits).all():
                raise ScanError(f"the logits of sequence {b} hold NaN or inf; the model or readout is broken for it")
            logp = torch.log_softmax(logits.double(), -1)
            y = torch.multinomial(logp.detach().exp().reshape(-1, logp.shape[-1]), 1, generator=gen)
            picked = logp.reshape(-1, logp.shape[-1]).gather(1, y).sum()
            grads = torch.autograd.grad(picked, list(chosen.values()), allow_unused=True)
            for (name, _), g in zip(chosen.items(), grads):
                if g is not None:
                    fisher[name] += g.double() ** 2 / samples
