"""The screen's core math: squared per-sequence gradients with labels drawn from the model itself.

Zeroing weight i moves the parameters by delta = -w_i e_i. The KL between the clean output p and
the ablated one q has no first-order term (p minimises KL(p || .)), so to second order

    KL(p || q) = 1/2 w_i^2 F_ii,    F_ii = sum_t E_{y ~ p_t} [(d log p_t(y) / d theta_i)^2]

with F the Fisher of the model's own output distribution, summed over the counted positions t.
For one sequence b with labels y_bt drawn independently from p_bt, the gradient g_b of
sum_t log p_bt(y_bt) is a sum of per-position scores, each of mean zero, so the cross terms of
g_b^2 vanish in expectation and E[sum_b g_b^2] = F_ii exactly (tests/test_scan_screen.py checks
this by enumerating every label sequence of a tiny model). Per-*sequence* gradients (one
torch.func vmap'd backward over a block of sequences) rather than one gradient of the whole
batch: the estimate's noise falls with the number of sequences per draw, not only with draws.

Accumulation is float64 whatever the model's precision. A model torch.func cannot vmap (data-
dependent control flow, in-place ops on inputs), or whose parameters functional_call cannot swap
back cleanly (SwapError), falls back to one backward per sequence: the same numbers, slower.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from wtc.errors import ScanError, WtcError


class SwapError(WtcError, RuntimeError):
    """torch.func's functional_call did not give a parameter back as it was: the screen puts it
    back and goes on with one autograd backward per sequence (the same numbers)."""


def label_generator(seed: int, block: int, draw: int) -> torch.Generator:
    """The generator of one block's one draw: a screen's labels depend on (seed, block, draw) only,
    so a resumed or sharded screen draws exactly what one uninterrupted process draws."""
    state = np.random.SeedSequence([seed, block, draw]).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def label_probs(logits: torch.Tensor) -> torch.Tensor:
    """softmax(logits) in float64 on the CPU, where the labels are drawn (computed once per block:
    every draw of the block reads them)."""
    return torch.softmax(logits.detach().double(), -1).cpu()


def draw_labels(probs: torch.Tensor, generator: torch.Generator, device=None) -> torch.Tensor:
    """(m, T) labels, y_bt ~ probs_bt (label_probs of the logits), drawn on the CPU (reproducible on
    any device), returned on `device`."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1]).to(device or probs.device)


def _logits(readout, out) -> torch.Tensor:
    logits = readout(out)
    if not torch.is_tensor(logits) or not logits.is_floating_point() or logits.ndim != 3:
        raise ScanError(f"the readout must give float logits (B, T, V), got {type(logits).__name__}"
                        + (f" {tuple(logits.shape)}" if torch.is_tensor(logits) else ""))
    return logits


class _Unchecked(nn.Module):
    """A wtc Transformer's forward without its token-id check (data-dependent control flow, which
    torch.func.vmap cannot trace): the screen checks the tokens once, before any of this runs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model.logits_from(self.model.embed_tokens(tokens))


def vmappable(model: nn.Module) -> tuple[nn.Module, str]:
    """(module to functional_call, prefix of the model's parameter names in it)."""
    if hasattr(model, "logits_from") and hasattr(model, "embed_tokens") and hasattr(model, "check_tokens"):
        return _Unchecked(model), "model."
    return model, ""


def squared_sequence_gradients(model: nn.Module, chosen: dict[str, torch.Tensor], tokens: torch.Tensor,
                               labels: torch.Tensor, counted: torch.Tensor, readout,
                               vectorised: bool = True) -> dict[str, torch.Tensor]:
    """{name: sum_b (d/d theta sum_t counted_bt log p_bt(labels_bt))^2}, float64, shaped like each
    parameter; tokens, labels (m, T) int, counted (m, T) float (1 where a position counts).
    vectorised: one vmap'd backward over the m sequences (False: one backward per sequence)."""
    names = list(chosen)
    values = tuple(p.detach() for p in chosen.values())
    module, prefix = vmappable(model)

    def log_likelihood(vals, seq, lab, cnt):
        out = functional_call(module, {prefix + n: v for n, v in zip(names, vals)}, (seq[None],))
        logp = torch.log_softmax(_logits(readout, out)[0], -1)
        return (logp.gather(-1, lab[:, None])[:, 0] * cnt.to(logp.dtype)).sum()

    acc = {n: torch.zeros(p.shape, dtype=torch.float64, device=p.device) for n, p in chosen.items()}
    if vectorised:
        kept = [(m, dict(m._parameters)) for m in module.modules()]
        try:
            grads = vmap(grad(log_likelihood), in_dims=(None, 0, 0, 0))(values, tokens, labels, counted)
        finally:
            # functional_call swaps parameters in and back; a module that forwards attribute writes to
            # another (TransformerLens bridges: q/k/v views of a fused weight) can get something else
            # back, which would break every later pass: the originals are put back
            swapped = [k for m, params in kept for k, v in params.items() if m._parameters.get(k) is not v]
            for m, params in kept:
                m._parameters.update(params)
        if swapped:
            raise SwapError(f"torch.func could not swap {', '.join(swapped[:3])} in and out cleanly")
        for n, g in zip(names, grads):
            acc[n] += g.detach().double().square().sum(0)
        return acc
    params = [p for p in chosen.values()]
    for b in range(tokens.shape[0]):             # the same sum, one autograd backward per sequence
        logp = torch.log_softmax(_logits(readout, model(tokens[b:b + 1]))[0], -1)
        picked = (logp.gather(-1, labels[b][:, None])[:, 0] * counted[b].to(logp.dtype)).sum()
        for n, g in zip(names, torch.autograd.grad(picked, params, allow_unused=True)):
            if g is not None:
                acc[n] += g.double().square()
    return acc


def fisher_diagonal_reference(model: nn.Module, chosen: dict[str, torch.Tensor], tokens: torch.Tensor,
                              counted: torch.Tensor, readout) -> dict[str, torch.Tensor]:
    """Brute force, float64: sum_t sum_v p_tv (d log p_tv / d theta)^2 with one backward per
    (sequence, position, class). The oracle of the tests (tiny models only)."""
    params = list(chosen.values())
    out = {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in chosen.items()}
    for b in range(tokens.shape[0]):
        logp = torch.log_softmax(_logits(readout, model(tokens[b:b + 1]))[0].double(), -1)
        for t in range(tokens.shape[1]):
            if not counted[b, t]:
                continue
            for v in range(logp.shape[-1]):
                gs = torch.autograd.grad(logp[t, v], params, retain_graph=True, allow_unused=True)
                for n, g in zip(chosen, gs):
                    if g is not None:
                        out[n] += logp[t, v].exp().detach() * g.double().square()
    return out
