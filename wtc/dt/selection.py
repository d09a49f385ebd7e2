"""Annealed categorical selection: which stream variable each read slot of a module uses.

Each slot holds logits over the variables present when its module runs. During annealing the
choice is a Gumbel-softmax sample at temperature tau (a soft mixture at high tau, nearly one-hot at
low tau); in the hard phase the forward pass uses the argmax with straight-through gradients;
once frozen the slot is a fixed index. Masks (controllability) remove variables from a slot.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wtc.dt.config import ConfigError
from wtc.kernels.products import read_product


@dataclass(frozen=True)
class Sampling:
    """How every discrete choice in a forward pass is made.

    annealing: Gumbel noise, soft (or straight-through hard) at temperature tau;
    hard phase: argmax forward, straight-through gradients at tau;
    evaluation: argmax, no noise, no gradient path (the frozen discrete model).
    """

    tau: float = 1.0
    hard: bool = True
    noise: bool = False
    straight_through: bool = False
    generator: torch.Generator | None = None
    native: bool = False  # hard routing through wtc._C when possible (inference only)
    stats: bool = False   # collect attention entropies (training logs)

    @staticmethod
    def anneal(tau: float, *, gumbel: bool, straight_through: bool, generator=None) -> "Sampling":
        return Sampling(tau=tau, hard=straight_through, noise=gumbel, straight_through=straight_through,
                        generator=generator)

    @staticmethod
    def hard_phase(tau: float) -> "Sampling":
        return Sampling(tau=tau, hard=True, noise=False, straight_through=True)


EVAL = Sampling()


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))


def relaxed_one_hot(logits: torch.Tensor, tau: float, *, hard: bool, noise: torch.Tensor | None,
                    straight_through: bool) -> torch.Tensor:
    """Soft (Gumbel-)softmax over the last axis, or a one-hot argmax (optionally straight-through).

    logits must already hold -inf where a choice is masked out.
    """
    z = logits if noise is None else logits + noise
    if not hard:
        return torch.softmax(z / tau, dim=-1)
    one_hot = torch.zeros_like(z).scatter_(-1, z.argmax(dim=-1, keepdim=True), 1.0)
    if straight_through:
        soft = torch.softmax(z / tau, dim=-1)
        return one_hot + soft - soft.detach()
    return one_hot


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) over the last axis; 0 * log 0 = 0."""
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


class Choice:
    """The outcome of a Selector for one forward pass: soft weights (R, S, V), or indices (R, S)
    once frozen (reads become gathers instead of contractions over V)."""

    def __init__(self, weights: torch.Tensor | None = None, index: torch.Tensor | None = None):
        self.weights, self.index = weights, index

    def read(self, values: torch.Tensor, slots: slice = slice(None)) -> torch.Tensor:
        """values (R, ..., V) -> the chosen (or mixed) variables per slot (R, ..., S')."""
        if self.index is not None:
            ix = self.index[:, slots]                                            # (R, S')
            ix = ix.view(ix.shape[0], *([1] * (values.ndim - 2)), ix.shape[1])
            return values.gather(-1, ix.expand(*values.shape[:-1], ix.shape[-1]))
        return read_product(values, self.weights[:, slots])


class Selector(nn.Module):
    """S read slots of R replicas choosing among V variables: logits (R, S, V), mask (S, V)."""

    def __init__(self, replicas: int, slot_names: list[str], variable_names: list[str], mask: torch.Tensor):
        super().__init__()
        self.slot_names = list(slot_names)
        self.variable_names = list(variable_names)
        S, V = len(slot_names), len(variable_names)
        if mask.shape != (S, V):
            raise ValueError(f"mask shape {tuple(mask.shape)} != (slots, variables) = {(S, V)}")
        empty = [slot_names[s] for s in range(S) if not mask[s].any()]
        if empty:
            raise ConfigError(f"selection slots with no readable variable (check DTConfig.read): {empty}")
        self.logits = nn.Parameter(0.1 * torch.randn(replicas, S, V))
        self.register_buffer("mask", mask.clone())
        self.register_buffer("frozen_index", torch.full((replicas, S), -1, dtype=torch.long))
        self.known_frozen: bool | None = None   # set only inside DiscreteTransformer.structure_known

    @property
    def frozen(self) -> bool:
        if self.known_frozen is not None:   # a captured CUDA graph must not read the device (wtc.dt.graph_step)
            return self.known_frozen
        return bool((self.frozen_index >= 0).all())

    def masked_logits(self) -> torch.Tensor:
        return self.logits.masked_fill(~self.mask, float("-inf"))

    def probabilities(self, tau: float) -> torch.Tensor:
        """Noise-free selection distribution at temperature tau: (R, S, V)."""
        return torch.softmax(self.masked_logits() / tau, dim=-1)

    def index(self) -> torch.Tensor:
        """The chosen variable per slot (frozen, else the argmax): (R, S)."""
        return self.frozen_index if self.frozen else self.masked_logits().argmax(-1)

    def forward(self, sampling: Sampling) -> Choice:
        """This pass's choice: indices once frozen, else (relaxed) one-hot weights (R, S, V)."""
        if self.frozen:
            return Choice(index=self.frozen_index)
        logits = self.masked_logits()
        noise = gumbel_like(logits, sampling.generator) if sampling.noise else None
        return Choice(weights=relaxed_one_hot(logits, sampling.tau, hard=sampling.hard, noise=noise,
                                              straight_through=sampling.straight_through))

    @torch.no_grad()
    def freeze(self) -> None:
        self.frozen_index.copy_(self.masked_logits().argmax(-1))
        self.logits.requires_grad_(False)

    def chosen(self, replica: int = 0) -> dict[str, str]:
        """{slot name: variable name} for one replica."""
        idx = self.index()[replica].tolist()
        return {s: self.variable_names[i] for s, i in zip(self.slot_names, idx)}
