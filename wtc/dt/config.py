"""DTConfig: architecture, schedule and steering of a Discrete Transformer, validated on creation."""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
from dataclasses import dataclass, field

from wtc.arguments import KnownFields
from wtc.errors import WtcError

ACTIVATIONS = ("relu", "silu", "gelu", "tanh", "relu+silu")
EXTREME_OPS = ("max", "min")    # prefix extremes: "any so far" / "all so far" of an indicator
AGG_OPS = ("mean", "sum") + EXTREME_OPS + tuple(f"per{p}" for p in range(2, 9))   # per<p>: wtc.dt.periodic


MAX_ACTIVATION_BYTES = 2**30     # one float32 activation of a training step (DTConfig.check_size)


class ConfigError(WtcError, ValueError):
    """A DTConfig field is out of range or inconsistent; the message names the field."""


class ConfigTypeError(ConfigError, TypeError):
    """Something that is not a DTConfig was passed where one is expected."""


def _per_layer(value, n_layers: int, name: str) -> tuple[int, ...]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        values = (int(value),) * n_layers
    elif isinstance(value, (tuple, list)):
        values = tuple(int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v for v in value)
    else:
        raise ConfigError(f"{name} must be a non-negative integer or one per layer (a tuple), got {value!r}")
    if len(values) != n_layers:
        raise ConfigError(f"{name}: {len(values)} entries given for n_layers={n_layers}")
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise ConfigError(f"{name} must be non-negative integers, got {value!r}")
    return values


@dataclass
class DTConfig(KnownFields):
    """Everything that defines a Discrete Transformer and how it is trained.

    Architecture (per layer: pointer heads, then aggregate heads, then sub-MLPs; every module
    appends one named scalar to the residual stream):
      n_heads      pointer heads per layer (int, or one int per layer)
      n_recent_heads  of each layer's n_heads pointer heads, how many (the last ones) are recency
                   heads (beyond the paper; int or one per layer, default 0): a head whose argmax is
                   the LATEST key scoring best on its key variable ("the latest j where pred(k_j)",
                   j < t or j <= t as it learns): a carry (the latest digit sum that is not base - 1),
                   the last value seen, the last non-zero (wtc.dt.attention.recency_params)
      n_agg_heads  aggregate heads per layer: uniform over the causal prefix (beyond the paper)
      agg_ops      what each aggregate head computes, cycled over a layer's heads: "mean" (the prefix
                   mean) or "sum" (the prefix sum: a sum of sums, such as a position from its
                   acceleration, is then linear in the stream: two layers of sums), "max" / "min" (the
                   prefix extremes: of an indicator a sub-MLP computes, "whether P held at some j <= t"
                   / "at every j <= t", such as a prefix that never went below zero) or "per2" .. "per8"
                   (a prefix sum weighted by a learned period-p function of the distance: a number
                   read in base g modulo d, an oscillation; wtc.dt.periodic)
      n_mlps       sub-MLPs per layer; each reads `mlp_inputs` variables, `mlp_hidden` units
      mlp_depth    hidden layers per sub-MLP (1 or 2); 2 represents a max of three exactly
      mlp_periods  periods P of the sub-MLPs' periodic units (beyond the paper; () = none): features
                   cos/sin(2 pi a n / P) of each input n in program units, so n % P, parity and
                   tables over small integers are exact (wtc.dt.submlp)
      ple_bins     PLE components per variable for attention scores
      pad          virtual positions before the start (all variables 0 there); None = seq_len - 1,
                   so every relative offset 0..seq_len-1 has a key at every query
    Steering (beyond the paper; the paper shows constraints change the algorithm found):
      read         {module pattern: [variable patterns]}: which variables a selection slot may read,
                   fnmatch patterns on slot names ("L0.h0.q", "L1.m0.in1", "*.v") and variable
                   names ("x", "pos", "L0.h*"); slots not matched read everything allowed by default
      qk_position  whether attention query/key slots may read the position variable. Off by default:
                   positional routing goes through the tied relative/absolute scores instead (a free
                   PLE(pos)^T W PLE(pos) form gives every position pair its own parameter)
      content_fraction  share of replicas whose heads may score content (PLE(q), PLE(k)); the others
                   route by position only. Soft content attention approximates a windowed max
                   easily but rarely exactly, while pointers plus max sub-MLPs are exact: a mixed
                   population tries both inductive biases in the same run
      redundancy_penalty  weight of the penalty on pairs of heads that route the same variable from the
                   same keys during annealing (keeps heads from collapsing onto one offset)
      offset_prior initial score bonus of each head's preferred offset (head h of replica r prefers
                   t - 1 - (h + r) mod H): recent positions first, a different one per head
    Training:
      steps        annealing steps (tau geometric tau_start -> tau_end, updated every step)
      hard_steps   steps with argmax forward and straight-through gradients at lr * hard_lr_scale
      polish_iters L-BFGS iterations on the frozen model (sub-MLPs + head, full batch)
      precision_iters  float64 L-BFGS iterations for the (two) best replicas that are close but not
                   solved after the float32 polish (0 disables)
      refine_steps steps fitting each frozen pointer head to its counterfactually best keys
                   (wtc.dt.refine; 0 disables)
      snap         after annealing, set each pointer head that nearly follows a routing rule (an
                   offset, a windowed or prefix max/min) to that rule exactly where the replica's
                   loss falls (wtc.dt.snap): a learned argmax is right except at near-ties
      replicas     independent models trained side by side in one batched forward (a population:
                   tiny models are overhead-bound, so R replicas cost far less than R runs)
      max_attempts populations tried (new seeds) until one replica solves the task
      workers      attempts (rungs) trained at once in worker processes, by train and discover (None:
                   one per CPU core; 1: sequential in this process). Same result for any value
      grow         restarts climb the capacity ladder (LADDER below: 3-input sub-MLPs, aggregate heads,
                   a second layer, prefix statistics alone) instead of repeating the same
                   architecture with new seeds. A windowed maximum needs a three-way operator or two
                   chained ones; a prefix sum needs an aggregate head; a vote needs means of
                   functions of the input: the engine finds out by trying, not the user
      device       where the training steps and the finishing fits run ('cpu', 'cuda', 'cuda:N'); on
                   a CUDA device the DT's routing and sub-MLPs run as fused Triton kernels
                   (wtc.kernels). Models are built on the CPU (same initial model for a seed on any
                   device) and returned on the CPU
    """

    _field_error = ConfigError          # an unknown keyword (wtc.arguments.KnownFields)

    n_layers: int = 1
    n_heads: int | tuple[int, ...] = 3
    n_recent_heads: int | tuple[int, ...] = 0
    n_agg_heads: int | tuple[int, ...] = 0
    agg_ops: tuple[str, ...] = ("mean",)
    n_mlps: int | tuple[int, ...] = 3
    mlp_inputs: int = 2
    mlp_hidden: int = 24
    mlp_depth: int = 1
    mlp_activation: str = "relu+silu"
    mlp_periods: tuple[int, ...] = ()
    ple_bins: int = 16
    pad: int | None = None
    read: dict[str, list[str]] = field(default_factory=dict)
    qk_position: bool = False
    content_fraction: float = 0.25
    redundancy_penalty: float = 0.1
    offset_prior: float = 4.0

    steps: int = 1000
    hard_steps: int = 300
    polish_iters: int = 200
    refine_steps: int = 0
    snap: bool = True
    precision_iters: int = 1000
    batch_size: int = 128
    lr: float = 1e-2
    hard_lr_scale: float = 0.01
    weight_decay: float = 0.0
    tau_start: float = 10.0
    tau_end: float = 0.1
    gumbel: bool = True
    straight_through: bool = False
    replicas: int = 8
    max_attempts: int = 4
    grow: bool = True
    workers: int | None = None
    eval_sequences: int = 2048
    threads: int | None = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        def integer(name, lo):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                kind = "positive" if lo == 1 else "non-negative"
                raise ConfigError(f"{name} must be a {kind} integer, got {value!r}")

        def real(name, lo=None, hi=None, strict=False):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
            if lo is not None and (value <= lo if strict else value < lo) or hi is not None and value > hi:
                rng = f"> {lo}" if strict else (f"in [{lo}, {hi}]" if hi is not None else f">= {lo}")
                raise ConfigError(f"{name} must be {rng}, got {value!r}")
            setattr(self, name, float(value))

        integer("n_layers", 1)
        self.n_heads = _per_layer(self.n_heads, self.n_layers, "n_heads")
        self.n_agg_heads = _per_layer(self.n_agg_heads, self.n_layers, "n_agg_heads")
        self.n_mlps = _per_layer(self.n_mlps, self.n_layers, "n_mlps")
        self.n_recent_heads = _per_layer(self.n_recent_heads, self.n_layers, "n_recent_heads")
        if any(r > h for r, h in zip(self.n_recent_heads, self.n_heads)):
            raise ConfigError(f"n_recent_heads {self.n_recent_heads} exceeds n_heads {self.n_heads} in some layer: "
                              "recency heads are some of a layer's pointer heads")
        for name in ("mlp_inputs", "mlp_hidden", "ple_bins", "batch_size", "replicas", "max_attempts",
                     "eval_sequences", "steps"):
            integer(name, 1)
        for name in ("hard_steps", "polish_iters", "refine_steps", "precision_iters"):
            integer(name, 0)
        for name in ("lr", "tau_start", "tau_end", "hard_lr_scale"):
            real(name, 0.0, strict=True)
        real("content_fraction", 0.0, 1.0)
        real("redundancy_penalty", 0.0)
        real("weight_decay", 0.0)
        real("offset_prior")
        for name in ("qk_position", "gumbel", "straight_through", "grow", "snap"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.tau_end > self.tau_start:
            raise ConfigError(f"tau_end ({self.tau_end}) must not exceed tau_start ({self.tau_start})")
        if self.mlp_activation not in ACTIVATIONS:
            raise ConfigError(f"mlp_activation must be one of {ACTIVATIONS}, got {self.mlp_activation!r}")
        if self.mlp_depth not in (1, 2) or isinstance(self.mlp_depth, bool):
            raise ConfigError(f"mlp_depth must be 1 or 2 hidden layers, got {self.mlp_depth!r}")
        periods = self.mlp_periods
        if not isinstance(periods, (tuple, list)) or not all(
                isinstance(p, numbers.Integral) and not isinstance(p, bool) and 2 <= p <= 64 for p in periods):
            raise ConfigError(f"mlp_periods must be a tuple of whole periods in 2..64, got {periods!r}")
        self.mlp_periods = tuple(sorted({int(p) for p in periods}))
        ops = self.agg_ops
        if not isinstance(ops, (tuple, list)) or not ops or not all(o in AGG_OPS for o in ops):
            raise ConfigError(f"agg_ops must be a non-empty tuple of {AGG_OPS}, got {ops!r}")
        self.agg_ops = tuple(ops)
        if self.mlp_activation == "relu+silu" and self.mlp_hidden < 2:
            raise ConfigError("mlp_activation='relu+silu' needs mlp_hidden >= 2")
        for name in ("pad", "workers", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < (0 if name == "pad" else 1)):
                kind = "non-negative" if name == "pad" else "positive"
                raise ConfigError(f"{name} must be None or a {kind} integer, got {value!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if not isinstance(self.read, dict) or not all(
                isinstance(k, str) and isinstance(v, (list, tuple)) and all(isinstance(p, str) for p in v)
                for k, v in self.read.items()):
            raise ConfigError("read must map slot patterns (str) to lists of variable patterns (str)")
        self.read = {k: list(v) for k, v in self.read.items()}
        if all(h + a + m == 0 for h, a, m in zip(self.n_heads, self.n_agg_heads, self.n_mlps)):
            raise ConfigError("the model has no modules: set n_heads, n_agg_heads or n_mlps")

    def check_size(self, seq_len: int, n_inputs: int = 1) -> None:
        """ConfigError when one activation of a training step would exceed MAX_ACTIVATION_BYTES
        (an attention score tensor grows as replicas x batch x heads x T x (pad + T)): such a run
        would exhaust memory or take days, so it is refused up front, naming the sizes."""
        pad = seq_len - 1 if self.pad is None else self.pad
        keys = pad + seq_len
        heads = max(h + a for h, a in zip(self.n_heads, self.n_agg_heads))
        variables = n_inputs + 1 + self.n_layers * (max(self.n_heads) + max(self.n_agg_heads) + max(self.n_mlps))
        rows = self.replicas * max(self.batch_size, self.eval_sequences // 4)
        sizes = {"attention scores": rows * max(heads, 1) * seq_len * keys,
                 "PLE encodings": rows * keys * variables * self.ple_bins,
                 "sub-MLP hidden units": rows * seq_len * max(self.n_mlps) * self.mlp_hidden * self.mlp_depth}
        advice = {"attention scores": "shorter sequences, a smaller pad or batch_size, or fewer replicas or heads",
                  "PLE encodings": "a smaller pad, fewer ple_bins, a smaller batch_size or fewer replicas",
                  "sub-MLP hidden units": "fewer mlp_hidden units or sub-MLPs, a smaller batch_size or fewer replicas"}
        what, n = max(sizes.items(), key=lambda kv: kv[1])
        if 4 * n > MAX_ACTIVATION_BYTES:
            raise ConfigError(f"a training step would hold {4 * n / 2**30:.1f} GiB of {what} (seq_len {seq_len}, "
                              f"pad {pad}, replicas {self.replicas}, batch_size {self.batch_size}, "
                              f"eval_sequences {self.eval_sequences}); the limit is {MAX_ACTIVATION_BYTES / 2**30:.0f} "
                              f"GiB: use {advice[what]}")

    def rung(self, attempt: int) -> tuple[str, "DTConfig"]:
        """(label, config) of restart `attempt`: the next LADDER step when `grow`, else this config.
        The first pass takes only steps that give a configuration not met before (a base sized
        with aggregate heads gets nothing from "+ aggregate heads" but a new seed: in the
        benchmarks' records none of 17 such rungs verified); later passes cycle the whole LADDER."""
        if not self.grow:
            return "as configured", self
        first = self._first_pass()
        return self._step(first[attempt] if attempt < len(first) else (attempt - len(first)) % len(LADDER))

    def _first_pass(self) -> list[int]:
        """The LADDER steps whose configuration differs from every earlier step's, in order."""
        seen, steps = [], []
        for k in range(len(LADDER)):
            config = self._step(k)[1]
            if config not in seen:
                seen.append(config)
                steps.append(k)
        return steps

    def _step(self, k: int) -> tuple[str, "DTConfig"]:
        """(label, config) of LADDER step k applied to this config."""
        label, changes = LADDER[k]
        if "n_heads" in changes:
            heads, most, top = changes["n_heads"], max(self.n_heads), max(changes["n_heads"])
            if top:          # a rung never has fewer pointer heads than its base: its first layer gets the base's
                heads = tuple(max(h, most) if h == top else h for h in heads)
            elif most > DTConfig.__dataclass_fields__["n_heads"].default:
                heads = (most,) + heads[1:]      # a rung without any drops the default heads, not heads grown or set
            changes = {**changes, "n_heads": heads}
        if "agg_ops" in changes:                 # nor loses an aggregate op its base has
            changes = {**changes, "agg_ops": tuple(dict.fromkeys(self.agg_ops + changes["agg_ops"]))}
        if "mlp_inputs" in changes and changes["mlp_inputs"] < self.mlp_inputs:   # nor reads fewer inputs
            changes = {**changes, "mlp_inputs": self.mlp_inputs}
            label = label.replace("3-input", f"{self.mlp_inputs}-input")
        if "steps_scale" in changes:             # trains longer in proportion to the base (a user's short runs stay short)
            changes = {**{k: v for k, v in changes.items() if k != "steps_scale"},
                       "steps": self.steps * changes["steps_scale"]}
        if any(self.n_recent_heads):             # nor loses its recency heads: they stay in the last layer
            layers = changes.get("n_layers", self.n_layers)
            recent = (0,) * (layers - 1) + (max(self.n_recent_heads),) if layers != self.n_layers else self.n_recent_heads
            heads = _per_layer(changes.get("n_heads", self.n_heads), layers, "n_heads")
            changes = {**changes, "n_recent_heads": recent,
                       "n_heads": tuple(max(h, r) for h, r in zip(heads, recent))}
        return label, self.replace(**changes)

    def replace(self, **changes) -> "DTConfig":
        """A copy with changes; per-layer counts not given follow a new n_layers when uniform."""
        if "n_layers" in changes:
            for key in ("n_heads", "n_agg_heads", "n_mlps", "n_recent_heads"):
                values = getattr(self, key)
                if key not in changes and len(set(values)) == 1:
                    changes[key] = values[0]
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for key in ("n_heads", "n_agg_heads", "n_mlps", "n_recent_heads", "mlp_periods", "agg_ops"):
            d[key] = list(d[key])
        if not any(self.n_recent_heads):   # the records of models without them read as they did before the field
            del d["n_recent_heads"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DTConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown DTConfig fields: {sorted(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# (label, DTConfig changes) applied to the user's config on restart i (i mod len), cheapest first.
LADDER = [
    ("as configured", {}),
    ("3-input, 2-hidden-layer sub-MLPs", {"mlp_inputs": 3, "mlp_depth": 2}),
    ("+ aggregate heads", {"n_agg_heads": 2}),
    # two layers: a prefix sum of a prefix sum (or of a sub-MLP's output) needs sum aggregates
    ("two layers: chained sub-MLPs", {"n_layers": 2, "n_heads": (3, 0), "n_mlps": (3, 2), "agg_ops": ("mean", "sum")}),
    ("two layers: heads in both", {"n_layers": 2, "n_heads": (3, 2), "n_mlps": (3, 2), "agg_ops": ("mean", "sum")}),
    # "P held at some / every j <= t" of a P a first-layer sub-MLP computes (a prefix still sorted,
    # x_j >= x_(j-1) at every j: no replica of 64 in eight attempts on the other rungs learned it, 6
    # of 24 here in three seeds)
    ("two layers: prefix extremes of sub-MLPs", {"n_layers": 2, "n_heads": (3, 0), "n_agg_heads": (1, 4),
                                                 "agg_ops": ("max", "min"), "n_mlps": (3, 2)}),
    # prefix statistics only: means of sub-MLPs of the input (its frequencies value by value) and a
    # sub-MLP of three of them (a vote among four values). Without pointer heads: Majority_0_2 was
    # learned by 5 of 24 replicas so, by 0 of 32 with three heads (and a third sub-MLP and mean head)
    # in the first layer
    # trained six times as long as the base (a vote among four values: no replica of 32 learned it in
    # 1000 or 3000 annealing steps; in 6000 one did, right on 0.9995 of positions, read as the argmax)
    ("two layers: prefix means of sub-MLPs", {"n_layers": 2, "n_heads": (0, 0), "n_agg_heads": (1, 2), "agg_ops": ("mean",),
                                             "n_mlps": (2, 1), "mlp_inputs": 3, "mlp_depth": 2, "steps_scale": 6}),
]
