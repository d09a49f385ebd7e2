"""Discrete Transformer layers for your own PyTorch code: ordinary (B, T, ...) tensors in and out.

    dt = DTLayers(seq_len=10, n_inputs=1, n_heads=2, n_mlps=2)   # DTConfig architecture fields
    head = LinearReadout(dt, 1, target_mean=..., target_scale=...)
    stream = dt(x)            # x (B, T, n_inputs) raw values -> (B, T, V), V = len(dt.variable_names)
    y = head(stream)          # (B, T, n_outputs) in target units
    loss = mse(y, target) + dt.redundancy_loss;  ...;  dt.schedule.step()
    dt.freeze()               # when dt.schedule.phase == "done"; then wtc.extract(model, task)
    finish(dt, head, x, y)    # optional: freeze, then the exact head refit and polish wtc.train ends with

DTLayers is the DT's layers (pointer / aggregate heads and sub-MLPs appending named scalars to
the stream) as one module; LinearReadout is its head. Inside, a single-replica
DiscreteTransformer does the work (the replica axis of wtc.train's populations is not visible
here), so a model built from these two reads out exactly as a wtc.train model does
(wtc.extract finds them inside your module: wtc.extraction.embedded).

Input normalisation is part of DTLayers: inputs are divided by the largest |x| (raw 0 stays 0),
from `input_range` when given, else from the first batch it sees in train() mode, and kept in
buffers (so in state_dict). The module-output ranges that place the attention PLE bins are set on
the first training batch and then tracked, as wtc.train does.

In train() mode the discrete choices follow `schedule` (an Anneal your loop steps); in eval()
mode, and once frozen, they are argmax choices, which is what extraction reads.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from wtc.dt.config import ConfigError, DTConfig
from wtc.dt.finish import masked_mse, polish, refit_head
from wtc.dt.model import DiscreteTransformer
from wtc.dt.schedule import Anneal
from wtc.dt.selection import EVAL, Sampling
from wtc.errors import ModelInputError, ModelInputTypeError

__all__ = ["DTLayers", "LinearReadout", "Anneal", "Finished", "compose", "finish"]

POLISH_SEQUENCES = 1024      # full batch of finish()'s L-BFGS polish, as wtc.train's


def _input_range(value, n_inputs: int) -> np.ndarray | None:
    """None, one (lo, hi) for every input, or one pair per input -> (n_inputs, 2) float64."""
    if value is None:
        return None
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        a = None
    if a is None or a.shape not in ((2,), (n_inputs, 2)):
        raise ConfigError(f"input_range must be (lo, hi) or {n_inputs} such pairs (one per input), got {value!r}")
    a = np.broadcast_to(a, (n_inputs, 2))
    if not np.all(np.isfinite(a)) or np.any(a[:, 0] > a[:, 1]):
        raise ConfigError(f"input_range must hold finite (lo, hi) pairs with lo <= hi, got {value!r}")
    return a


class DTLayers(nn.Module):
    """The layers of a Discrete Transformer: raw inputs (B, T, n_inputs) -> the stream (B, T, V).

    Stream variables (`variable_names`): the inputs ("x" or "x0", "x1", ...), "pos" (t / (T - 1)),
    then each module's output in order ("L0.h0", ..., "L0.m0", ...). Inputs are in model units
    (divided by `input_scale`). `structure()` says what each module reads.

    seq_len, n_inputs: the sequences it takes. config: a DTConfig for the architecture (default
    DTConfig()); keyword arguments replace its fields (n_layers=2, n_heads=3, ...); `replicas` is
    ignored (one model). schedule: the Anneal followed in train() mode (default: the one `config`
    describes); your loop calls schedule.step() after each update. input_range: (lo, hi), or one
    pair per input, of the raw inputs; None: fit from the first training batch.

    `redundancy_loss` (after each forward): the penalty wtc.train adds to its loss on pairs of
    heads that route the same variable from the same keys (DTConfig.redundancy_penalty times
    their overlap; 0 outside the annealing phase); add it to your loss.
    """

    def __init__(self, seq_len: int, n_inputs: int = 1, *, config: DTConfig | None = None,
                 schedule: Anneal | None = None, input_range=None, **changes):
        super().__init__()
        for name, value in (("seq_len", seq_len), ("n_inputs", n_inputs)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if config is not None and not isinstance(config, DTConfig):
            raise ConfigError(f"config must be a wtc.DTConfig, got {type(config).__name__}")
        config = (config or DTConfig()).replace(**changes) if changes else (config or DTConfig())
        if schedule is not None and not isinstance(schedule, Anneal):
            raise ConfigError(f"schedule must be a wtc.dt.layers.Anneal, got {type(schedule).__name__}")
        self.schedule = schedule if schedule is not None else Anneal.from_config(config)
        self.dt = DiscreteTransformer(config, seq_len=int(seq_len), n_inputs=int(n_inputs), n_outputs=1, replicas=1)
        # the inner model's own head is never used here: LinearReadout is the head (wtc.extract joins them)
        self.dt.W_out.requires_grad_(False)
        self.dt.b_out.requires_grad_(False)
        self.register_buffer("inputs_fitted", torch.tensor(False))
        self.register_buffer("ranges_set", torch.tensor(False))
        rng = _input_range(input_range, int(n_inputs))
        if rng is not None:
            self._fit_inputs(rng.T[:, None, :])          # (2, 1, n_in): the extremes as two samples
        # the last forward's penalty on heads routing the same variable from the same keys (see the class)
        self.redundancy_loss = torch.zeros(())

    # ------------------------------------------------------------------ shape and names
    @property
    def seq_len(self) -> int:
        return self.dt.seq_len

    @property
    def n_inputs(self) -> int:
        return self.dt.n_inputs

    @property
    def config(self) -> DTConfig:
        return self.dt.config

    @property
    def variable_names(self) -> list[str]:
        """The stream's variables, in the order of its last axis."""
        return list(self.dt.variable_names)

    @property
    def out_features(self) -> int:
        """V: the size of the stream's last axis (what a LinearReadout reads)."""
        return len(self.dt.variable_names)

    @property
    def input_scale(self) -> torch.Tensor:
        """(n_inputs,) raw input = model input * input_scale."""
        return self.dt.x_scale

    @property
    def frozen(self) -> bool:
        return bool(self.dt.frozen)

    def structure(self) -> dict[str, str]:
        """{read slot: chosen variable}: "L0.h0.v": "x", "L0.m0.in0": "L0.h0", ..."""
        return self.dt.structure(0)

    def extra_repr(self) -> str:
        return f"seq_len={self.seq_len}, n_inputs={self.n_inputs}, variables={self.variable_names}"

    # ------------------------------------------------------------------ normalisation
    @torch.no_grad()
    def _fit_inputs(self, x: np.ndarray) -> None:
        # the inner head is unused, so its target moments stay 0 / 1 (a zero target has no spread)
        self.dt.fit_normalization(x, np.zeros(x.shape[:2] + (1,)))
        self.inputs_fitted.fill_(True)

    @torch.no_grad()
    def _set_ranges(self, xn: torch.Tensor) -> None:
        """Module-output ranges from the untrained modules on a first batch, as wtc.train sets them."""
        cfg = self.dt.config
        self.dt(xn, Sampling.anneal(cfg.tau_start, gumbel=False, straight_through=False), track_ranges="set")
        self.ranges_set.fill_(True)

    def _check(self, x) -> torch.Tensor:
        if not torch.is_tensor(x):
            raise ModelInputTypeError(f"DTLayers takes a torch tensor (B, T={self.seq_len}, n_inputs={self.n_inputs}), "
                                      f"got {type(x).__name__}")
        if x.is_complex() or x.dtype == torch.bool:
            raise ModelInputTypeError(f"DTLayers takes real inputs, got a {x.dtype} tensor")
        if x.ndim == 2 and self.n_inputs == 1:
            x = x.unsqueeze(-1)
        if x.ndim != 3 or tuple(x.shape[1:]) != (self.seq_len, self.n_inputs) or x.shape[0] == 0:
            also = f" or (B, {self.seq_len})" if self.n_inputs == 1 else ""
            raise ModelInputError(f"DTLayers takes inputs (B, T={self.seq_len}, n_inputs={self.n_inputs}){also} "
                                  f"with B >= 1, got shape {tuple(x.shape)}")
        x = x.to(self.dt.x_scale.dtype)
        if not bool(torch.isfinite(x).all()):
            raise ModelInputError("DTLayers inputs contain NaN or inf")
        return x

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Raw inputs (B, T, n_inputs) (or (B, T) for one input) -> the stream (B, T, V)."""
        x = self._check(x)
        frozen = self.frozen
        if not bool(self.inputs_fitted):
            if not self.training:
                raise ModelInputError("DTLayers has no input normalisation yet: run it on a training batch in "
                                      "train() mode first, or give input_range=(lo, hi)")
            self._fit_inputs(x.detach().cpu().double().numpy())
        xn = self.dt.normalize_inputs(x)
        if self.training and not frozen and not bool(self.ranges_set):
            self._set_ranges(xn)
        learning = self.training and not frozen
        sampling = self.schedule.sampling() if learning else EVAL
        captured = []
        with self.dt.hooks([("hook_stream", lambda stream, hook: captured.append(stream))]):
            _, stats = self.dt(xn, sampling, track_ranges="ema" if learning else False)
        penalty = self.dt.config.redundancy_penalty
        self.redundancy_loss = (penalty * torch.stack(stats["redundancy"]).sum() if penalty and stats["redundancy"]
                                else xn.new_zeros(()))
        return captured[0][0, :, self.dt.P:]

    @torch.no_grad()
    def freeze(self) -> None:
        """Fix every discrete choice to its argmax (pointers become hard); training may go on for
        the continuous parts (sub-MLPs, readout). wtc.extract reads only a frozen model."""
        if not bool(self.inputs_fitted):
            raise ModelInputError("DTLayers was never trained (no input normalisation): train it before freeze()")
        self.dt.freeze()


class LinearReadout(nn.Module):
    """The DT's head: the stream (B, T, V) -> outputs (B, T, n_outputs) in target units,
    y = (stream @ weight + bias) * target_scale + target_mean.

    in_features: V, or the DTLayers it reads. target_mean / target_scale: the targets' mean and
    spread (a number, or one per output), so that the weights learn in normalised units as
    wtc.train's do; they are buffers (in state_dict), not trained.
    """

    def __init__(self, in_features: int | DTLayers, out_features: int = 1, *, target_mean=0.0, target_scale=1.0):
        super().__init__()
        V = in_features.out_features if isinstance(in_features, DTLayers) else in_features
        for name, value in (("in_features", V), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"{name} must be a positive integer (or a DTLayers), got {value!r}")
        V, O = int(V), int(out_features)
        stats = {}
        for name, value in (("target_mean", target_mean), ("target_scale", target_scale)):
            try:
                a = np.broadcast_to(np.asarray(value, dtype=np.float64), (O,))
            except (TypeError, ValueError):
                raise ConfigError(f"{name} must be a number or {O} numbers (one per output), got {value!r}") from None
            if not np.all(np.isfinite(a)) or (name == "target_scale" and np.any(a <= 0)):
                raise ConfigError(f"{name} must be finite{' and > 0' if name == 'target_scale' else ''}, got {value!r}")
            stats[name] = torch.as_tensor(a.copy(), dtype=torch.float32)
        # initialised as DiscreteTransformer's head
        self.weight = nn.Parameter(0.1 * torch.randn(V, O) / math.sqrt(V))
        self.bias = nn.Parameter(torch.zeros(O))
        self.register_buffer("target_mean", stats["target_mean"])
        self.register_buffer("target_scale", stats["target_scale"])

    @property
    def in_features(self) -> int:
        return self.weight.shape[0]

    @property
    def out_features(self) -> int:
        return self.weight.shape[1]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"

    def forward(self, stream: torch.Tensor) -> torch.Tensor:
        if not torch.is_tensor(stream):
            raise ModelInputTypeError(f"LinearReadout takes a torch tensor (B, T, {self.in_features}), "
                                      f"got {type(stream).__name__}")
        if stream.ndim != 3 or stream.shape[-1] != self.in_features:
            raise ModelInputError(f"LinearReadout takes a stream (B, T, V={self.in_features}), got shape "
                                  f"{tuple(stream.shape)}")
        return (stream @ self.weight + self.bias) * self.target_scale + self.target_mean


def compose(layers: DTLayers, readout: LinearReadout) -> DiscreteTransformer:
    """The single-replica DiscreteTransformer that computes readout(layers(x)): layers' modules
    and normalisation, readout's weights as its head (what wtc.extract reads)."""
    if readout.in_features != layers.out_features:
        raise ConfigError(f"the readout reads {readout.in_features} variables, the DTLayers' stream has "
                          f"{layers.out_features}")
    inner = layers.dt
    model = DiscreteTransformer(inner.config, seq_len=inner.seq_len, n_inputs=inner.n_inputs,
                                n_outputs=readout.out_features, replicas=1)
    state = {k: v.detach().clone() for k, v in inner.state_dict().items()}
    state.update(W_out=readout.weight.detach()[None].clone(), b_out=readout.bias.detach()[None].clone(),
                 y_mean=readout.target_mean.clone(), y_scale=readout.target_scale.clone())
    model.load_state_dict(state)
    if bool(model.frozen):
        for sel in model.selectors():
            sel.logits.requires_grad_(False)
    model.train_info = {}
    return model.to(readout.weight.device).eval()


@dataclass
class Finished:
    """What finish() did: mean squared error on its data (target units) before and after."""
    mse_before: float
    mse_after: float


def finish(layers: DTLayers, readout: LinearReadout, x, y, *, polish_iters: int = 200) -> Finished:
    """End training as wtc.train does: freeze the discrete choices, refit the readout by least
    squares on the frozen stream, then polish the sub-MLPs and readout with full-batch L-BFGS
    (pointers pinned; wtc.dt.finish). A gradient loop rarely gets a linear head exact (an integer
    target of 200 needs 0.25% precision to round right); least squares does.

    x (n, T, n_inputs) raw inputs, y (n, T, n_outputs) targets (NaN = not scored), numpy or torch.
    The layers and readout are updated in place."""
    from wtc.arguments import real_array

    if not isinstance(layers, DTLayers) or not isinstance(readout, LinearReadout):
        raise ConfigError(f"finish takes a DTLayers and a LinearReadout, got {type(layers).__name__} and "
                          f"{type(readout).__name__}")
    if isinstance(polish_iters, bool) or not isinstance(polish_iters, numbers.Integral) or polish_iters < 0:
        raise ConfigError(f"polish_iters must be a non-negative integer, got {polish_iters!r}")
    device = readout.weight.device
    xt = layers._check(torch.as_tensor(real_array(x, "x", ModelInputError), dtype=torch.float32, device=device))
    y = real_array(y, "y", ModelInputError)
    if y.ndim == 2 and readout.out_features == 1:
        y = y[..., None]
    if y.shape != (xt.shape[0], layers.seq_len, readout.out_features):
        raise ModelInputError(f"y has shape {y.shape}, expected (n, T, n_outputs) = "
                              f"{(xt.shape[0], layers.seq_len, readout.out_features)} for x of shape {tuple(xt.shape)}")
    layers.freeze()
    model = compose(layers, readout)
    xn = model.normalize_inputs(xt)
    y_raw = torch.as_tensor(y, dtype=torch.float32, device=device)
    valid = torch.isfinite(y_raw).float()
    y_raw = torch.nan_to_num(y_raw)
    yt = model.normalize_targets(y_raw)

    def mse() -> float:   # in target units
        with torch.no_grad():
            return float(masked_mse(model.denormalize_outputs(model(xn)[0]), y_raw, valid)[0])

    before = mse()
    refit_head(model, xn, yt, valid)
    if polish_iters:
        n = POLISH_SEQUENCES
        polish(model, xn[:n], yt[:n], valid[:n], iters=polish_iters)
    after = mse()
    with torch.no_grad():
        inner = {k: v for k, v in model.state_dict().items() if k not in ("W_out", "b_out", "y_mean", "y_scale")}
        layers.dt.load_state_dict({**layers.dt.state_dict(), **inner})
        readout.weight.copy_(model.W_out[0])
        readout.bias.copy_(model.b_out[0])
    return Finished(mse_before=before, mse_after=after)
