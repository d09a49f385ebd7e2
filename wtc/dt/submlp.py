"""Numerical MLP: a bank of independent sub-MLPs, each an operator on k chosen stream variables.

Sub-MLP m reads k variables (annealed selections, one per input slot), maps them through one
hidden layer (two with depth=2) plus a linear skip to one scalar that is appended to the stream.
One hidden layer represents max(a, b) = a + relu(b - a) exactly but not max(a, b, c), which needs
a ReLU of a ReLU; depth 2 does (a depth-1 fit of max of three integers in [0, 100) stays 5-7 off,
depth 2 within 0.25-0.41: measured by a direct L-BFGS fit, see bench/RESULTS.md). With mlp_activation='relu+silu' half of
the hidden units are ReLU (exact kinks: max, min, relu) and half SiLU (smooth: products, squares).

Periodic units (DTConfig.mlp_periods, beyond the paper): a bounded stack of ReLUs has a bounded
number of kinks, so `x % 2` on 0..99 (about 100 kinks) is out of reach of 24 units. Every function of
n mod P is a linear combination of cos(2 pi a n / P) and sin(2 pi a n / P), a = 1..P//2, so each
sub-MLP also reads those features of its inputs in program units (the integers a user gave, the
position t) and adds a learned linear combination of them: parity, counters mod k, x // 3 =
(x - x % 3) / 3 and any table over 0..9 become exact (linear in the features).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wtc import kernels
from wtc.kernels import cpu as cpu_kernels
from wtc.backend import choose
from wtc.dt.selection import Sampling, Selector
from wtc.hooks import HookPoint

def frequencies(periods: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """The distinct reduced fractions a / P (0 < a / P <= 1/2) of the periods, ascending, and how
    many of them get a sine (all but 1/2: sin(pi n) = 0 on integers). (F,), n_sine."""
    fracs = sorted({round(a / P, 12) for P in periods for a in range(1, P // 2 + 1)})
    return torch.tensor(fracs, dtype=torch.float64), sum(f != 0.5 for f in fracs)


def periodic_features(raw: torch.Tensor, freqs: torch.Tensor, n_sine: int | None = None) -> torch.Tensor:
    """raw (..., V) program-unit values -> (..., F, V): cos(2 pi f raw) for every frequency, then
    sin(2 pi f raw) for those below 1/2 (F = 2 * len(freqs) - [1/2 in freqs]). n_sine: how many
    get a sine, as frequencies() gives it (default: read from freqs, a device read on a GPU)."""
    angle = (2 * torch.pi) * raw.unsqueeze(-2) * freqs.to(raw.dtype)[:, None]   # (..., n_freq, V)
    if n_sine is None:
        n_sine = len(freqs) - int(bool(freqs[-1] == 0.5))    # ascending: 1/2, when there, is the last
    return torch.cat([torch.cos(angle), torch.sin(angle[..., :n_sine, :])], dim=-2)


_ACT = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu, "tanh": torch.tanh}


def activate(h: torch.Tensor, activation: str) -> torch.Tensor:
    """Hidden activations (..., hidden); 'relu+silu': the first half ReLU, the rest SiLU."""
    if activation != "relu+silu":
        return _ACT[activation](h)
    half = h.shape[-1] // 2
    return torch.cat([F.relu(h[..., :half]), F.silu(h[..., half:])], dim=-1)


class SubMLPs(nn.Module):
    """M sub-MLPs with k inputs and `hidden` units each, for R replicas."""

    def __init__(self, layer: int, replicas: int, n_mlps: int, k: int, hidden: int, activation: str,
                 variable_names: list[str], mask_fn, depth: int = 1, periods: tuple[int, ...] = ()):
        super().__init__()
        R, M = replicas, n_mlps
        self.layer, self.M, self.k, self.activation, self.depth = layer, n_mlps, k, activation, depth
        self.names = [f"L{layer}.m{m}" for m in range(M)]
        slots = [f"{n}.in{i}" for n in self.names for i in range(k)]   # slot m*k + i
        self.select = Selector(R, slots, variable_names, mask_fn(slots, variable_names))
        w1 = torch.randn(R, M, hidden, k) * (2.0 / k) ** 0.5
        centre = torch.rand(R, M, hidden, k)          # put each unit's kink inside the [0, 1] cube
        self.W1 = nn.Parameter(w1)
        self.b1 = nn.Parameter(-(w1 * centre).sum(-1))
        if depth == 2:   # second hidden layer, He-scaled, started as a near pass-through of the first
            self.W_mid = nn.Parameter(torch.eye(hidden).expand(R, M, -1, -1) + torch.randn(R, M, hidden, hidden)
                                      * (0.5 / hidden ** 0.5))
            self.b_mid = nn.Parameter(torch.zeros(R, M, hidden))
        elif depth != 1:
            raise ValueError(f"sub-MLP depth must be 1 or 2, got {depth}")
        self.W2 = nn.Parameter(torch.randn(R, M, hidden) * (0.5 / hidden ** 0.5))
        self.b2 = nn.Parameter(torch.zeros(R, M))
        self.skip = nn.Parameter(torch.zeros(R, M, k))   # affine part: linear functions stay exact
        self.periods = tuple(periods)
        if self.periods:   # W_per starts at 0: the unit is off until the loss asks for it
            freqs, n_sine = frequencies(self.periods)
            self.register_buffer("freqs", freqs.float())
            self.W_per = nn.Parameter(torch.zeros(R, M, k, len(freqs) + n_sine))
        else:
            self.W_per = None
        # (R, M): outputs replaced by round((output - level_origin) / level_size) once the model is
        # frozen, a summed step set to its levels (wtc.dt.step_snap)
        self.register_buffer("whole", torch.zeros(R, M, dtype=torch.bool))
        self.register_buffer("level_origin", torch.zeros(R, M))
        self.register_buffer("level_size", torch.ones(R, M))
        # the outputs' program unit, what a later layer's periodic units multiply them by: 1 (model
        # units); 0 in models saved before it existed, whose periodic units read no sub-MLP output
        self.register_buffer("output_unit", torch.ones(()))
        self.hook_pre = HookPoint()    # (R, B, T, M, k): each sub-MLP's inputs
        self.hook_post = HookPoint()   # (R, B, T, M): each sub-MLP's output

    def parameters_of_map(self) -> list[nn.Parameter]:
        """The continuous parameters of the sub-MLP functions (not the selections)."""
        mid = [self.W_mid, self.b_mid] if self.depth == 2 else []
        per = [self.W_per] if self.W_per is not None else []
        return [self.W1, self.b1, *mid, self.W2, self.b2, self.skip, *per]

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return activate(h, self.activation)

    def evaluate(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs (R, ..., M, k) -> outputs (R, ..., M); the sub-MLPs as plain functions."""
        shape = inputs.shape
        x = inputs.reshape(shape[0], -1, self.M, self.k)                      # (R, N, M, k)
        h = self.act(torch.einsum("rnmk,rmhk->rnmh", x, self.W1) + self.b1[:, None])
        if self.depth == 2:
            h = self.act(torch.einsum("rnmh,rmgh->rnmg", h, self.W_mid) + self.b_mid[:, None])
        y = torch.einsum("rnmh,rmh->rnm", h, self.W2) + self.b2[:, None] + (x * self.skip[:, None]).sum(-1)
        return y.reshape(shape[:-1])

    def periodic(self, stream: torch.Tensor, units: torch.Tensor, choice) -> torch.Tensor:
        """The periodic units' part of the outputs (R, B, T, M): features of every variable in
        program units (stream * units, units (R, T, V)), read through the slots' choice (a soft choice
        mixes the features, so the selection's gradient stays smooth), weighted by W_per.
        Both are linear in the features: a soft choice is folded into W_per first (one (F V) x M
        product per replica; mixing the features per slot and then weighting them made 1.5x the
        step of a two-layer model with periods 2..6, measured), and a hard one takes the features of
        the chosen values only (the same numbers as choosing among every variable's)."""
        raw = stream * units[:, None]                                               # (R, B, T, V)
        n_sine = self.W_per.shape[-1] - len(self.freqs)                             # from shapes: no device read
        if choice.index is not None:
            feats = periodic_features(choice.read(raw), self.freqs, n_sine)         # (R, B, T, F, M k)
            return torch.einsum("rbtfmk,rmkf->rbtm", feats.unflatten(-1, (self.M, self.k)), self.W_per)
        feats = periodic_features(raw, self.freqs, n_sine)                          # (R, B, T, F, V)
        R, B, T, F, V = feats.shape
        weights = torch.einsum("rmkv,rmkf->rfvm", choice.weights.unflatten(1, (self.M, self.k)), self.W_per)
        return torch.bmm(feats.reshape(R, B * T, F * V), weights.reshape(R, F * V, self.M)).view(R, B, T, self.M)

    def periodic_reference(self, stream: torch.Tensor, units: torch.Tensor, choice) -> torch.Tensor:
        """periodic() as defined: every variable's features, read through the choice per slot, then
        weighted (the readable path; tests compare the folded one with it)."""
        feats = periodic_features(stream * units[:, None], self.freqs)              # (R, B, T, F, V)
        feats = choice.read(feats).unflatten(-1, (self.M, self.k))                  # (R, B, T, F, M, k)
        return torch.einsum("rbtfmk,rmkf->rbtm", feats, self.W_per)

    def forward(self, stream: torch.Tensor, sampling: Sampling, units: torch.Tensor | None = None) -> torch.Tensor:
        """stream (R, B, T, V) at real positions -> outputs (R, B, T, M). units (R, T, V): each
        variable's program unit (raw value = stream * units), needed with periodic units."""
        choice = self.select(sampling)
        out = self._bank(stream, choice)
        if self.W_per is not None:
            if units is None:
                raise ValueError("sub-MLPs with periodic units need the variables' units (R, T, V)")
            out = out + self.periodic(stream, units, choice)
        if choice.index is not None:    # frozen: rounding is set only then (and passes no gradient)
            level = (out - self.level_origin[:, None, None]) / self.level_size[:, None, None]
            out = torch.where(self.whole[:, None, None], level.round(), out)
        return self.hook_post(out)

    def _bank(self, stream: torch.Tensor, choice) -> torch.Tensor:
        """The MLP part of the outputs (R, B, T, M) on the fastest backend for stream."""
        backend = choose("dt.mlp_bank", stream)
        if backend == "triton" and not self.hook_pre.has_hooks:   # fused: inputs never stored
            R, B, T, V = stream.shape
            select = choice.index if choice.index is not None else choice.weights
            mid = dict(W_mid=self.W_mid, b_mid=self.b_mid) if self.depth == 2 else {}
            y = kernels.mlp_bank(stream.reshape(R, B * T, V), select, self.W1, self.b1, self.W2, self.b2,
                                 self.skip, self.activation, **mid)
            return y.view(R, B, T, self.M)
        inputs = choice.read(stream)                                           # (R, B, T, M*k)
        inputs = self.hook_pre(inputs.unflatten(-1, (self.M, self.k)))
        if backend == "native":   # the same function, fused on the CPU (hidden layers never stored)
            mid = dict(W_mid=self.W_mid, b_mid=self.b_mid) if self.depth == 2 else {}
            return cpu_kernels.mlp_bank(inputs, self.W1, self.b1, self.W2, self.b2, self.skip,
                                        self.activation, **mid)
        return self.evaluate(inputs)
