"""The Discrete Transformer: a residual stream of named scalars, routing-only attention,
sub-MLP operators and a linear head; R independent replicas side by side.

Stream: per position, the inputs (x or x0, x1, ...), the position pos = t / (T - 1), then each
module's output appended by concatenation (never added), in order L0.h*, L0.a*, L0.m*, L1.h*, ...
Model units: inputs are divided by the largest |x| seen at fit_normalization (so they lie in
[-1, 1] and raw 0 stays 0); pos = t / (T - 1); every other variable is in the units its module
produces. `pad` virtual positions precede the sequence, where
every variable equals 0 in program units ("before the start values are 0").

Shapes: R replicas, B sequences, T positions, P pads, L = P + T, V variables, N PLE bins.
"""
from __future__ import annotations

import contextlib
import fnmatch
import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from wtc.errors import ModelInputError
from wtc.dt.attention import Attention
from wtc.dt.config import DTConfig
from wtc.dt.selection import EVAL, Sampling
from wtc.dt.submlp import SubMLPs
from wtc.hooks import Hooked, HookPoint
from wtc.kernels.products import read_product

RANGE_MOMENTUM = 0.05
PER_REPLICA_BUFFERS = ("var_lo", "var_hi", "frozen_index", "content", "whole", "level_origin",
                       "level_size")  # leading axis R, like parameters


def read_mask(slots: list[str], variables: list[str], config: DTConfig) -> torch.Tensor:
    """(S, V) bool: which variables each slot may read (DTConfig.read and qk_position). An
    aggregate head never reads pos: its prefix mean is pos / 2 and its sum a polynomial in pos, both
    functions of pos alone, and early in training a mixture with pos hides which aggregate to
    build on (seen: every replica summed the prefix mean of x + pos, not the sum of x, on a double
    prefix sum)."""
    mask = torch.ones(len(slots), len(variables), dtype=torch.bool)
    for s, slot in enumerate(slots):
        if not config.qk_position and slot.endswith((".q", ".k")) and "pos" in variables:
            mask[s, variables.index("pos")] = False
        if re.fullmatch(r"L\d+\.a\d+\.v", slot) and "pos" in variables:
            mask[s, variables.index("pos")] = False
        for pattern, allowed in config.read.items():
            if fnmatch.fnmatchcase(slot, pattern):
                mask[s] = torch.tensor([any(fnmatch.fnmatchcase(v, a) for a in allowed) for v in variables])
    return mask


def _check_read_patterns(config: DTConfig, slots: list[str], variables: list[str]) -> None:
    """A DTConfig.read pattern that matches no slot, or whose variable patterns match no variable,
    would be silently ignored: refuse it, naming the pattern and what exists."""
    from wtc.dt.config import ConfigError

    for pattern, allowed in config.read.items():
        if not any(fnmatch.fnmatchcase(s, pattern) for s in slots):
            raise ConfigError(f"DTConfig.read: slot pattern {pattern!r} matches no selection slot "
                              f"(slots: {', '.join(slots)})")
        dead = [a for a in allowed if not any(fnmatch.fnmatchcase(v, a) for v in variables)]
        if dead:
            raise ConfigError(f"DTConfig.read[{pattern!r}]: variable pattern(s) {dead} match no variable "
                              f"(variables: {', '.join(variables)})")


def content_replicas(R: int, fraction: float) -> torch.Tensor:
    """(R,) 0/1: the last round(R * fraction) replicas (at least one if fraction > 0) score content."""
    n = 0 if fraction <= 0 else max(1, round(R * fraction))
    return torch.arange(R) >= R - n


class Block(nn.Module):
    def __init__(self, attn: Attention | None, mlp: SubMLPs | None):
        super().__init__()
        self.attn, self.mlp = attn, mlp
        self.hook_resid_post = HookPoint()   # (R, B, L, V) after this block


class DiscreteTransformer(Hooked):
    def __init__(self, config: DTConfig, *, seq_len: int, n_inputs: int = 1, n_outputs: int = 1,
                 replicas: int | None = None):
        super().__init__()
        if seq_len < 1 or n_inputs < 1 or n_outputs < 1:
            raise ValueError(f"seq_len, n_inputs, n_outputs must be >= 1, got {seq_len}, {n_inputs}, {n_outputs}")
        self.config = config
        self.seq_len, self.n_inputs, self.n_outputs = seq_len, n_inputs, n_outputs
        self.R = R = replicas or config.replicas
        self.P = seq_len - 1 if config.pad is None else config.pad
        self.input_names = ["x"] if n_inputs == 1 else [f"x{i}" for i in range(n_inputs)]
        names = self.input_names + ["pos"]
        blocks = []
        for layer in range(config.n_layers):
            attn = mlp = None
            H, A, M = config.n_heads[layer], config.n_agg_heads[layer], config.n_mlps[layer]
            mask_fn = lambda slots, variables: read_mask(slots, variables, config)  # noqa: E731
            if H + A:
                attn = Attention(layer, R, H, A, config.ple_bins, seq_len, self.P, names, mask_fn,
                                 content_replicas(R, config.content_fraction), config.offset_prior,
                                 config.agg_ops, config.n_recent_heads[layer])
                names = names + attn.output_names
            if M:
                mlp = SubMLPs(layer, R, M, config.mlp_inputs, config.mlp_hidden, config.mlp_activation,
                              names, mask_fn, depth=config.mlp_depth, periods=config.mlp_periods)
                names = names + mlp.names
            blocks.append(Block(attn, mlp))
        self.blocks = nn.ModuleList(blocks)
        self.variable_names = names
        _check_read_patterns(config, [s for sel in self.selectors() for s in sel.slot_names], names)
        V, n_fixed = len(names), n_inputs + 1
        self.W_out = nn.Parameter(0.1 * torch.randn(R, V, n_outputs) / V ** 0.5)
        self.b_out = nn.Parameter(torch.zeros(R, n_outputs))
        # PLE ranges: inputs and pos start on [0, 1] (set from data for inputs), module outputs are
        # tracked during training
        self.register_buffer("var_lo", torch.zeros(R, V))
        self.register_buffer("var_hi", torch.ones(R, V))
        self.register_buffer("x_scale", torch.ones(n_inputs))
        self.register_buffer("y_mean", torch.zeros(n_outputs))
        self.register_buffer("y_scale", torch.ones(n_outputs))
        self.register_buffer("frozen", torch.tensor(False))
        self._known_frozen: bool | None = None   # set only inside structure_known
        self.n_fixed = n_fixed
        self.hook_stream = HookPoint()   # (R, B, L, V): the whole final stream, pads included
        self.hook_out = HookPoint()      # (R, B, T, O): normalised predictions
        self.setup_hooks()

    # ------------------------------------------------------------------ normalisation
    @torch.no_grad()
    def fit_normalization(self, x: np.ndarray, y: np.ndarray) -> None:
        """Input ranges and target moments from raw data x (n, T, n_in), y (n, T, O; NaN = invalid)."""
        # a pure scale (no shift) keeps raw 0 at model 0, so "0 before the start" holds in both units
        top = np.abs(x).max(axis=(0, 1))
        scale = np.where(top > 0, top, 1.0)
        self.x_scale.copy_(torch.as_tensor(scale, dtype=torch.float32))
        for i in range(self.n_inputs):   # PLE range of each input in model units
            self.var_lo[:, i] = float(x[..., i].min() / scale[i])
            self.var_hi[:, i] = float(x[..., i].max() / scale[i])
        flat = y.reshape(-1, y.shape[-1])
        mean, std = np.nanmean(flat, axis=0), np.nanstd(flat, axis=0)
        self.y_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.y_scale.copy_(torch.as_tensor(np.where(std > 1e-12, std, 1.0), dtype=torch.float32))

    def normalize_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.x_scale

    def normalize_targets(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.y_mean) / self.y_scale

    def denormalize_outputs(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.y_scale + self.y_mean

    # ------------------------------------------------------------------ forward
    def input_units(self) -> torch.Tensor:
        """(R, T, n_in + 1): program units of the inputs (raw = model value * x_scale) and of pos (t)
        at every real position (an aggregate's unit grows with t: its periodic units read the sum)."""
        pos = self.x_scale.new_full((1,), float(max(self.seq_len - 1, 1)))
        return torch.cat([self.x_scale, pos]).expand(self.R, self.seq_len, -1)

    def initial_stream(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised inputs (B, T, n_in) -> stream (R, B, L, n_in + 1) with the pads in front."""
        B, T, _ = x.shape
        if T != self.seq_len:
            raise ValueError(f"inputs have {T} positions, the model was built for seq_len={self.seq_len}")
        inputs = torch.cat([x.new_zeros(B, self.P, x.shape[-1]), x], dim=1)     # (B, L, n_in)
        pos = torch.arange(T, dtype=x.dtype, device=x.device) / max(T - 1, 1)
        pos = torch.cat([torch.zeros(self.P, dtype=x.dtype, device=x.device), pos])
        stream = torch.cat([inputs, pos.expand(B, -1).unsqueeze(-1)], dim=-1)  # (B, L, V0)
        return stream.expand(self.R, -1, -1, -1)

    def _append(self, stream: torch.Tensor, new: torch.Tensor, track: bool) -> torch.Tensor:
        """Append module outputs new (R, B, T, n) with zeros at the pads; track their ranges."""
        V, n = stream.shape[-1], new.shape[-1]
        if track:
            with torch.no_grad():   # (R, n); over contiguous rows: a strided amin/amax over (B, T) is 10x slower
                flat = new.reshape(new.shape[0], -1, n).transpose(1, 2).contiguous()
                lo, hi = flat.amin(-1), flat.amax(-1)
                m = RANGE_MOMENTUM if track == "ema" else 1.0
                self.var_lo[:, V:V + n].lerp_(lo, m)
                self.var_hi[:, V:V + n].lerp_(hi, m)
        return torch.cat([stream, F.pad(new, (0, 0, self.P, 0))], dim=-1)      # zeros at the pads

    def forward(self, x: torch.Tensor, sampling: Sampling = EVAL, *, track_ranges: bool | str = False):
        """Normalised inputs x (B, T, n_in) -> (normalised predictions (R, B, T, O), stats dict).

        track_ranges: False, "ema" (training) or "set" (calibration) for module-output ranges.
        """
        track = track_ranges if not self.is_frozen() else False
        stream = self.initial_stream(x)
        units = self.input_units() if self.config.mlp_periods else None   # (R, V) program units
        stats: dict[str, list] = {"attn_entropy": [], "redundancy": []}
        for block in self.blocks:
            if block.attn is not None:
                V = stream.shape[-1]
                lo, span = self.var_lo[:, None, None, :V], (self.var_hi - self.var_lo)[:, None, None, :V]
                unit = (stream - lo) / span.clamp(min=1e-6)                      # (R, B, L, V) on [0, 1]
                z, s = block.attn(stream, unit, sampling)                        # (R, B, H+A, T)
                for key in ("attn_entropy", "redundancy"):
                    if key in s:
                        stats[key].append(s[key])
                stream = self._append(stream, z.transpose(2, 3), track)
                if units is not None:   # a routed value is in its source's units; an average is read as its sum
                    H, A = block.attn.H, block.attn.A
                    index = block.attn.select.index()[:, 2 * H:]                     # (R, H + A)
                    new = units.gather(2, index[:, None, :].expand(-1, units.shape[1], -1))   # (R, T, H + A)
                    growth = block.attn.unit_growth().to(units.dtype)                  # (T, A)
                    new = torch.cat([new[..., :H], new[..., H:] * growth[None]], -1)
                    units = torch.cat([units, new], -1)
            if block.mlp is not None:
                m = block.mlp(stream[:, :, self.P:], sampling, units)            # (R, B, T, M)
                stream = self._append(stream, m, track)
                if units is not None:   # in model units (wtc.dt.step_snap makes a summed one whole)
                    units = torch.cat([units, block.mlp.output_unit.expand(*units.shape[:2], m.shape[-1])], -1)
            stream = block.hook_resid_post(stream)
        stream = self.hook_stream(stream)
        body = stream[:, :, self.P:]
        if body.is_cuda:      # the head's weight gradient split over batch x positions (wtc.kernels.products)
            y = read_product(body, self.W_out.transpose(1, 2))
        else:
            y = torch.einsum("rbtv,rvo->rbto", body, self.W_out)
        y = y + self.b_out[:, None, None]                                     # (R, B, T, O)
        return self.hook_out(y), stats

    def is_frozen(self) -> bool:
        return self._known_frozen if self._known_frozen is not None else bool(self.frozen)

    @contextlib.contextmanager
    def structure_known(self):
        """Within the block, whether the model and each selection are frozen is read once here and
        not from the device again: a CUDA graph capture fails on any device-to-host read, and the
        structure cannot change during the steps it captures (wtc.dt.graph_step)."""
        selectors = list(self.selectors())
        self._known_frozen = bool(self.frozen)
        for sel in selectors:
            sel.known_frozen = sel.frozen
        try:
            yield self
        finally:
            self._known_frozen = None
            for sel in selectors:
                sel.known_frozen = None

    def final_stream(self, x: torch.Tensor, sampling: Sampling = EVAL) -> torch.Tensor:
        """Normalised inputs (B, T, n_in) -> the final stream (R, B, L, V) the head reads."""
        captured = []
        with self.hooks([("hook_stream", lambda stream, hook: captured.append(stream))]):
            self(x, sampling)
        return captured[0]

    @contextlib.contextmanager
    def pinned_pointers(self, x: torch.Tensor):
        """Within the block, pointer heads reuse the argmax keys they pick on inputs x now.

        Pointers are piecewise constant in the parameters, so continuous refits (polish) can hold
        them fixed and skip the scores entirely; callers re-check the model afterwards.
        """
        captured = {}
        attns = {f"blocks.{i}.attn": b.attn for i, b in enumerate(self.blocks) if b.attn is not None and b.attn.H}

        def keep(name):
            return lambda pattern, hook: captured.__setitem__(name, pattern.argmax(-1))

        with torch.no_grad(), self.hooks([(f"{name}.hook_pattern", keep(name)) for name in attns]):
            self(x, EVAL)
        for name, a in attns.items():
            a.pinned = captured[name]
        try:
            yield self
        finally:
            for a in attns.values():
                a.pinned = None

    # ------------------------------------------------------------------ discrete structure
    def selectors(self):
        for block in self.blocks:
            for module in (block.attn, block.mlp):
                if module is not None:
                    yield module.select

    @torch.no_grad()
    def freeze(self) -> None:
        """Fix every selection to its argmax; attention is evaluated as argmax pointers from now on."""
        for sel in self.selectors():
            sel.freeze()
        self.frozen.fill_(True)

    def structure(self, replica: int = 0) -> dict[str, str]:
        """{read slot: chosen variable} (the argmax, or the frozen choice)."""
        out = {}
        for sel in self.selectors():
            out.update(sel.chosen(replica))
        return out

    def replica(self, i: int) -> "DiscreteTransformer":
        """A single-replica model holding replica i (parameters and buffers copied)."""
        return self.select_replicas([i])

    def select_replicas(self, indices: list[int]) -> "DiscreteTransformer":
        bad = [i for i in indices if not 0 <= i < self.R]
        if bad or not indices:
            raise IndexError(f"replica indices {indices} out of range for R={self.R}")
        new = DiscreteTransformer(self.config, seq_len=self.seq_len, n_inputs=self.n_inputs,
                                  n_outputs=self.n_outputs, replicas=len(indices))
        per_replica = self._per_replica_names()
        ix = torch.as_tensor(indices)
        target = {key: (value[ix] if key in per_replica else value).clone()
                  for key, value in self.state_dict().items()}
        new.load_state_dict(target)
        new.to(self.W_out.device)
        if bool(new.frozen):
            for sel in new.selectors():
                sel.logits.requires_grad_(False)
        return new.train(self.training)

    @torch.no_grad()
    def assign_replicas(self, indices: list[int], source: "DiscreteTransformer") -> None:
        """Copy the replicas of `source` into positions `indices` of this model."""
        if source.R != len(indices):
            raise ValueError(f"source holds {source.R} replicas, {len(indices)} indices given")
        ix = torch.as_tensor(indices)
        own = dict(self.named_parameters()) | dict(self.named_buffers())
        for name, value in list(source.named_parameters()) + list(source.named_buffers()):
            if name in self._per_replica_names():
                own[name][ix] = value

    def _per_replica_names(self) -> set[str]:
        names = {name for name, _ in self.named_parameters()}
        return names | {name for name, _ in self.named_buffers() if name.endswith(PER_REPLICA_BUFFERS)}

    # ------------------------------------------------------------------ numpy API
    def check_inputs(self, x) -> np.ndarray:
        """x as float64 (n, T, n_inputs); refuses other shapes, empty batches, complex, NaN/inf and
        magnitudes float32 cannot hold (the model computes in float32: they would come back NaN)."""
        from wtc.arguments import real_array
        from wtc.tasks.task import MAX_MAGNITUDE

        x = real_array(x, "x", ModelInputError)
        if x.ndim == 2 and self.n_inputs == 1:
            x = x[:, :, None]
        if x.ndim != 3 or x.shape[1:] != (self.seq_len, self.n_inputs):
            raise ModelInputError(f"x has shape {x.shape}, expected (n, {self.seq_len}, {self.n_inputs})"
                                  + (f" or (n, {self.seq_len})" if self.n_inputs == 1 else ""))
        if x.shape[0] == 0:
            raise ModelInputError("x holds no sequences (n = 0)")
        if not np.all(np.isfinite(x)):
            raise ModelInputError("x contains NaN or inf")
        if np.abs(x).max() > MAX_MAGNITUDE:
            raise ModelInputError(f"x holds |value| {np.abs(x).max():.3g} > {MAX_MAGNITUDE:g}; the model computes in float32")
        return x

    @torch.no_grad()
    def predict(self, x, *, replica: int | None = None, batch_size: int = 8192) -> np.ndarray:
        """Hard (argmax) predictions in task units: the shape target(x) returns.

        A population (R > 1) needs `replica`, or replica=-1 for all: (R, n, T[, O]).
        """
        if self.R > 1 and replica is None:
            raise ModelInputError(f"this model holds {self.R} replicas: pass replica=i (or -1 for all)")
        if replica is not None and (not isinstance(replica, (int, np.integer)) or isinstance(replica, bool)
                                    or not -1 <= replica < self.R):
            raise ModelInputError(f"replica must be an integer in [0, {self.R}) or -1 (all), got {replica!r}")
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ModelInputError(f"batch_size must be a positive integer, got {batch_size!r}")
        x = self.check_inputs(x)
        was_training = self.training
        self.eval()
        try:
            from wtc.backend import choose
            outs = []
            for start in range(0, len(x), batch_size):
                xb = self.normalize_inputs(torch.as_tensor(x[start:start + batch_size], dtype=torch.float32,
                                                           device=self.W_out.device))
                native = bool(self.frozen) and choose("dt.route_hard", xb, size=xb.shape[0] * self.seq_len) == "native"
                outs.append(self.denormalize_outputs(self(xb, Sampling(native=native))[0]).cpu())
            y = torch.cat(outs, dim=1).double().numpy()                          # (R, n, T, O)
        finally:
            self.train(was_training)
        if self.n_outputs == 1:
            y = y[..., 0]
        return y if replica == -1 else y[0 if replica is None else replica]

    @torch.no_grad()
    def run_with_cache(self, x, *, replica: int | None = None,
                       names_filter=None) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        """Hard predictions in task units plus the hooks' values ({'blocks.0.attn.hook_pattern': ...};
        names_filter as in wtc.hooks.Hooked: None for all, a name, a list of names or a callable)."""
        x = self.check_inputs(x)
        was_training = self.training
        self.eval()
        try:
            with self.caching(names_filter) as cache:
                y, _ = self(self.normalize_inputs(torch.as_tensor(x, dtype=torch.float32, device=self.W_out.device)), EVAL)
        finally:
            self.train(was_training)
        y = self.denormalize_outputs(y).double().cpu().numpy()
        cache = {k: v.cpu() for k, v in cache.items()}
        y = y[..., 0] if self.n_outputs == 1 else y
        if replica is not None:
            y = y[replica]
            cache = {k: v[replica:replica + 1] for k, v in cache.items()}
        return y, cache
