"""Weight-sparse (or dense) training of small byte-level language models (Gao et al. 2025).

A wtc.models.Transformer (RMSNorm, learned positions; `lm_config` gives the usual shape) learns
next-token prediction on a 1-D token array. After every AdamW step each weight matrix is projected
onto its top-k entries by magnitude (`project_topk`); only the weights are projected: gradients and
the AdamW moments stay dense, so a zeroed weight can come back when its moments push it above the
others. k is annealed linearly from dense to the target over the first `anneal_frac` of training
(`density_schedule`).

Matrices: every parameter with >= 2 dimensions that is not a bias (embed.W_E, pos_embed.W_pos,
attn.W_Q/W_K/W_V/W_O, mlp.W_in/W_out, unembed.W_U); norm weights (`w`) and biases (b_*, including
the 2-D attn.b_Q/b_K/b_V (H, d_head)) stay dense and get no weight decay. Each keeps
round(density * numel) entries: the global top-k of its |entries| (the same density everywhere).

Units ("neurons/channels"), for the min_per_unit rule: every one of these matrices has exactly one
residual-stream axis (d_model). A unit is one index of the other axes, i.e. one thing the residual
stream talks to, and its connections are its d_model entries along the residual axis. Each unit
keeps the top-`min_per_unit` of its connections by magnitude in addition to the global top-k, so
nothing the model owns is cut off from the residual stream:

    embed.W_E      (V, D)          unit = a token: its embedding writes >= 4 residual channels
    pos_embed.W_pos (n_ctx, D)     unit = a position
    attn.W_Q/K/V   (H, D, d_head)  as the matrix (D, H*d_head): unit = query/key/value channel (h, e),
                                   which reads >= 4 residual channels
    attn.W_O       (H, d_head, D)  as the matrix (H*d_head, D): unit = channel (h, e) of z, which
                                   writes >= 4 residual channels
    mlp.W_in       (D, d_mlp)      unit = an MLP neuron (column): reads >= 4 residual channels
    mlp.W_out      (d_mlp, D)      unit = an MLP neuron (row): writes >= 4 residual channels
    unembed.W_U    (D, V)          unit = a logit (column): reads >= 4 residual channels
    (other >= 2-D parameters: units are the indices of all axes but the last, the connection axis)

So a matrix has numel / d_model units and at most round(density * numel) + min_per_unit * numel /
d_model nonzeros: the allowance adds at most min_per_unit / d_model to the density (3.1% for
d_model 128 and 4). Residual channels themselves get no minimum.

Training (SparseTrainConfig): AdamW (betas (0.9, 0.95), decoupled weight decay 0.1 on the matrices
only, none on norms and biases), global-L2-norm gradient clipping (1.0), learning rate warmed up
linearly over `warmup` steps then cosine-decayed to min_lr_frac * lr at the last step. A batch is
`batch` random windows of ctx + 1 tokens (inputs and next-token targets, cross-entropy over all ctx
positions) drawn by numpy.random.default_rng([seed, step]), so the data are a function of (seed,
step) and a resumed run equals an uninterrupted one bit for bit. Activation sparsity (AbsTopK on
the MLP hidden layer: per position, keep the top fraction of units by |value|, zero the rest) is a
property of the model, TransformerConfig.mlp_abstopk, so the forward pass honours it and a saved
model keeps it; Gao et al.'s 1/4 is lm_config(abstopk=0.25) (lm_config's default is None: off).

The loop is wtc.models.training.Trainer (the post-step hook does the projection). Under `out`:
out/train_state.{safetensors,json}, the training state (model, AdamW state, step, history, held-out
evals; written as an atomic pair, read back with wtc.models.training.read_state / load_model),
out/history.json and out/summary.json. A call with the same `out` resumes from the training state;
one whose result-changing settings or data differ is refused (CheckpointError naming them).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wtc.errors import ArgumentError, ArgumentTypeError, ModelInputError, TrainConfigError, TrainConfigTypeError
from wtc.models.training import Eval, TrainConfig, Trainer, lr_at
from wtc.models.transformer import Transformer, TransformerConfig

# residual-stream (connection) axis of each matrix, by parameter-name suffix
RESIDUAL_AXIS = {"embed.W_E": 1, "pos_embed.W_pos": 1, "attn.W_Q": 1, "attn.W_K": 1, "attn.W_V": 1,
                 "attn.W_O": 2, "mlp.W_in": 0, "mlp.W_out": 1, "unembed.W_U": 0}

# fields besides the optimiser's (TrainConfig) that change the numbers: a resume needs the same values
_IDENTITY_FIELDS = ("batch", "density", "anneal_frac", "min_per_unit", "seed", "ctx")


def lm_config(abstopk: float | None = None, **overrides) -> TransformerConfig:
    """The byte-level LM shape used here: 2 layers, d_model 128, 4 heads of 32, d_mlp 512, ReLU,
    RMSNorm, learned positions, n_ctx 128, vocab 256; abstopk: AbsTopK fraction on the MLP hidden
    layer (Gao et al. use 1/4), None for none. Any TransformerConfig field can be overridden."""
    base = {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_head": 32, "d_mlp": 512, "d_vocab": 256, "n_ctx": 128,
            "act_fn": "relu", "normalization": "RMS", "mlp_abstopk": abstopk}
    return TransformerConfig(**{**base, **overrides})


@dataclass
class SparseTrainConfig:
    steps: int = 1000
    batch: int = 32
    lr: float = 1e-3
    warmup: int | None = None           # linear warmup steps; None: min(200, steps // 10)
    min_lr_frac: float = 0.1            # cosine decay from lr to min_lr_frac * lr at the last step
    weight_decay: float = 0.1           # decoupled (AdamW), matrices only
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0       # global L2 norm of the gradient; None: no clipping
    density: float = 1.0                # target fraction of nonzeros per matrix; 1.0 = dense training
    anneal_frac: float = 0.5            # density goes linearly 1 -> target over this fraction of steps
    min_per_unit: int = 4               # nonzeros every unit keeps (see the module doc)
    seed: int = 0                       # batches are numpy.random.default_rng([seed, step])
    ctx: int | None = None              # window length; None: the model's n_ctx
    threads: int | None = 1             # torch threads while training (None: leave as is). On the 2-core dev box:
                                        # 2 is ~1.5x faster when idle, 4-10x slower when another job holds the cores
    eval_every: int | None = 500        # held-out loss every this many steps (and at the end)
    checkpoint_every: int | None = None  # None: at every eval (and at the end / stop)
    eval_windows: int = 64              # fixed windows for the held-out and final train loss

    def __post_init__(self) -> None:
        def positive_int(name, allow_none=False, allow_zero=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < (0 if allow_zero else 1):
                kind = "non-negative" if allow_zero else "positive"
                raise TrainConfigError(f"SparseTrainConfig.{name} must be a {kind} int{' or None' if allow_none else ''}, "
                                       f"got {v!r}")

        def number(name, lo, hi, lo_open=False, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            ok = (isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
                  and math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi)
            if not ok:
                span = f"{'(' if lo_open else '['}{lo}, {hi}]"
                raise TrainConfigError(f"SparseTrainConfig.{name} must be a number in {span}"
                                       f"{' or None' if allow_none else ''}, got {v!r}")

        positive_int("steps")
        positive_int("batch")
        number("lr", 0, math.inf, lo_open=True)
        positive_int("warmup", allow_none=True, allow_zero=True)
        if self.warmup is None:
            self.warmup = min(200, self.steps // 10)
        if self.warmup > self.steps:
            raise TrainConfigError(f"SparseTrainConfig.warmup ({self.warmup}) exceeds steps ({self.steps})")
        number("min_lr_frac", 0, 1)
        number("weight_decay", 0, math.inf)
        b = self.betas
        if (not isinstance(b, (tuple, list)) or len(b) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in b)):
            raise TrainConfigError(f"SparseTrainConfig.betas must be two numbers in [0, 1), got {b!r}")
        self.betas = tuple(float(x) for x in b)
        number("grad_clip", 0, math.inf, lo_open=True, allow_none=True)
        number("density", 0, 1, lo_open=True)
        number("anneal_frac", 0, 1)
        positive_int("min_per_unit", allow_zero=True)
        positive_int("seed", allow_zero=True)
        positive_int("ctx", allow_none=True)
        positive_int("threads", allow_none=True)
        positive_int("eval_every", allow_none=True)
        positive_int("checkpoint_every", allow_none=True)
        positive_int("eval_windows")

    def optim(self) -> TrainConfig:
        """The optimiser part: AdamW, warmup, cosine decay to min_lr_frac * lr, clipping."""
        return TrainConfig(steps=self.steps, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay,
                           grad_clip=self.grad_clip, warmup=self.warmup, schedule="cosine",
                           min_lr_frac=self.min_lr_frac)


def density_schedule(step: int, cfg: SparseTrainConfig) -> float:
    """Density the weights have after `step` optimiser steps: 1 at step 0, linear down to
    cfg.density at step anneal_frac * steps, cfg.density from there on."""
    if cfg.density >= 1:
        return 1.0
    end = cfg.anneal_frac * cfg.steps
    if step >= end:
        return float(cfg.density)
    return 1.0 + (cfg.density - 1.0) * step / end


def lr_schedule(step: int, cfg: SparseTrainConfig) -> float:
    """Learning rate of update `step` (0-based): linear warmup to lr over cfg.warmup updates, then
    cosine down to min_lr_frac * lr at the last update (wtc.models.training.lr_at)."""
    return lr_at(step, cfg.optim())


# ---------------------------------------------------------------------------------- projection

def _residual_axis(name: str, p: torch.Tensor) -> int:
    for suffix, axis in RESIDUAL_AXIS.items():
        if name == suffix or name.endswith("." + suffix):
            return axis
    return p.ndim - 1


def _is_matrix(name: str, p: torch.Tensor) -> bool:
    last = name.rsplit(".", 1)[-1]
    return p.ndim >= 2 and not (last.startswith("b_") or last == "bias")


def sparse_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter, int]]:
    """(name, parameter, connection axis) of every matrix: a parameter with >= 2 dimensions that is
    not a bias (b_*, bias)."""
    return [(n, p, _residual_axis(n, p)) for n, p in model.named_parameters() if _is_matrix(n, p)]


def topk_mask(w: torch.Tensor, density: float, min_per_unit: int = 4, axis: int = -1) -> torch.Tensor | None:
    """Boolean mask of the entries `project_topk` keeps in w: its round(density * numel) largest |w|
    and, for every unit (index of the axes other than `axis`), its min_per_unit largest |w| along
    `axis`. None when everything is kept."""
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 <= density < math.inf:
        raise ArgumentError(f"density must be a finite number >= 0, got {density!r}")
    if isinstance(min_per_unit, bool) or not isinstance(min_per_unit, int) or min_per_unit < 0:
        raise ArgumentError(f"min_per_unit must be a non-negative int, got {min_per_unit!r}")
    if not torch.is_tensor(w) or w.ndim < 1:
        raise ArgumentTypeError(f"w must be a tensor with at least one dimension, got {type(w).__name__}")
    if isinstance(axis, bool) or not isinstance(axis, int) or not -w.ndim <= axis < w.ndim:
        raise ArgumentError(f"axis must be an int in [{-w.ndim}, {w.ndim}) for a weight of shape {tuple(w.shape)}, "
                            f"got {axis!r}")
    if w.is_floating_point() and not torch.isfinite(w).all():
        raise ArgumentError("w holds NaN or inf: its largest magnitudes are not defined")
    n = w.numel()
    k = min(n, round(density * n))
    if k >= n:
        return None
    a = w.detach().abs()
    keep = torch.zeros(n, dtype=torch.bool, device=w.device)
    if k > 0:
        keep[a.reshape(-1).topk(k, sorted=False).indices] = True
    keep = keep.view(w.shape)
    m = min(min_per_unit, w.shape[axis])
    if m > 0:
        idx = a.movedim(axis, -1).topk(m, dim=-1, sorted=False).indices
        keep.movedim(axis, -1).scatter_(-1, idx, True)       # writes through the view
    return keep


def _check_density(density, min_per_unit) -> None:
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise ArgumentError(f"density must be a number in (0, 1], got {density!r}")
    if isinstance(min_per_unit, bool) or not isinstance(min_per_unit, int) or min_per_unit < 0:
        raise ArgumentError(f"min_per_unit must be a non-negative int, got {min_per_unit!r}")


def _project(model: torch.nn.Module, density: float, min_per_unit: int) -> None:
    if density >= 1:
        return
    with torch.no_grad():
        for _, p, axis in sparse_parameters(model):
            keep = topk_mask(p, density, min_per_unit, axis)
            if keep is not None:
                p.masked_fill_(~keep, 0.0)


def project_topk(model: torch.nn.Module, density: float, min_per_unit: int = 4) -> dict[str, float]:
    """Zero, in place, every entry of every matrix that is neither among its matrix's
    round(density * numel) largest magnitudes nor among its unit's min_per_unit largest (units: the
    module doc). Returns the achieved density (fraction nonzero) of each matrix. Idempotent (ties
    aside)."""
    _check_density(density, min_per_unit)
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _project(model, float(density), min_per_unit)
    return nonzero_fraction(model, matrices_only=True)


def nonzero_fraction(model: torch.nn.Module, matrices_only: bool = False) -> dict[str, float]:
    """Fraction of nonzero entries of each parameter (only the matrices, see sparse_parameters,
    with matrices_only)."""
    return {n: float(torch.count_nonzero(p.detach())) / p.numel()
            for n, p in model.named_parameters() if not matrices_only or _is_matrix(n, p)}


def density_allowance(model: torch.nn.Module, density: float, min_per_unit: int = 4) -> dict[str, float]:
    """Upper bound on each matrix's density after project_topk: (round(density * numel) +
    min_per_unit * units) / numel, units = numel / (size of the connection axis)."""
    out = {}
    for n, p, axis in sparse_parameters(model):
        k = min(p.numel(), round(density * p.numel()))
        units = p.numel() // p.shape[axis]
        out[n] = min(1.0, (k + min(min_per_unit, p.shape[axis]) * units) / p.numel())
    return out


# ---------------------------------------------------------------------------------- data

def _check_tokens(tokens, what: str, ctx: int, vocab: int) -> np.ndarray:
    t = tokens.numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
    if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer):
        raise ModelInputError(f"{what} must be a 1-D integer array, got shape {t.shape} dtype {t.dtype}")
    if len(t) < ctx + 1:
        raise ModelInputError(f"{what} has {len(t)} tokens; a window needs ctx + 1 = {ctx + 1}")
    if vocab is None:
        return t
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= vocab:
        raise ModelInputError(f"{what} ids must lie in [0, {vocab}) (the model's d_vocab), got [{lo}, {hi}]")
    return t


def _fingerprint(t: np.ndarray | None) -> str | None:
    if t is None:
        return None
    canon = np.ascontiguousarray(t.astype(np.uint8 if int(t.max()) < 256 else np.int64, copy=False))
    return f"{len(t)}:{hashlib.blake2b(canon.data, digest_size=8).hexdigest()}"


def batch_windows(tokens: np.ndarray, ctx: int, batch: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (batch, ctx) int64 of training step `step`: random contiguous
    windows drawn by numpy.random.default_rng([seed, step])."""
    tokens = _check_tokens(tokens, "tokens", ctx, None)          # floats would be truncated
    starts = np.random.default_rng([seed, step]).integers(0, len(tokens) - ctx, size=batch)
    w = torch.from_numpy(tokens[starts[:, None] + np.arange(ctx + 1)].astype(np.int64))
    return w[:, :-1], w[:, 1:]


def eval_windows(tokens: np.ndarray, ctx: int, n: int) -> torch.Tensor:
    """n fixed windows of ctx + 1 tokens (B, ctx + 1), starts evenly spaced over the array."""
    tokens = _check_tokens(tokens, "tokens", ctx, None)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ArgumentError(f"n must be a positive integer (windows), got {n!r}")
    starts = np.unique(np.linspace(0, len(tokens) - ctx - 1, n).round().astype(np.int64))
    return torch.from_numpy(tokens[starts[:, None] + np.arange(ctx + 1)].astype(np.int64))


@torch.no_grad()
def lm_loss(model: Transformer, windows: torch.Tensor, batch: int = 32) -> float:
    """Mean next-token cross-entropy (nats per token, = per byte for byte tokens) over all
    positions of windows (B, ctx + 1)."""
    if not torch.is_tensor(windows) or windows.ndim != 2 or len(windows) == 0 or windows.shape[1] < 2:
        raise ModelInputError(f"windows must be a non-empty (B, ctx + 1) token tensor, got "
                              f"{tuple(windows.shape) if torch.is_tensor(windows) else type(windows).__name__}")
    was = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(windows), batch):
            w = windows[i:i + batch]
            logits = model(w[:, :-1])
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), w[:, 1:].reshape(-1),
                                           reduction="sum"))
            count += w[:, 1:].numel()
    finally:
        model.train(was)
    return total / count


# ---------------------------------------------------------------------------------- training

def train_lm(model: Transformer, train_tokens, cfg: SparseTrainConfig, out: Path | str | None = None,
             heldout_tokens=None, progress: bool = True, stop_after: int | None = None,
             budget_s: float | None = None) -> dict:
    """Train `model` in place on next-token prediction (module doc); resume from out/train_state
    when there is one. stop_after: return (checkpointed) once this many steps are done, as a kill
    would; budget_s: likewise once this many seconds have passed in this call. Returns
    {history: [{step, loss, density, lr}], evals: [{step, heldout_loss}], train_loss, heldout_loss
    (nats per token on fixed windows; None without held-out tokens), densities (achieved, per
    matrix), density_target, steps_done, finished, seconds (all calls), seconds_per_step,
    checkpoint (the training state's path or None)}."""
    if not isinstance(cfg, SparseTrainConfig):
        raise TrainConfigTypeError(f"cfg must be a SparseTrainConfig, got {type(cfg).__name__}")
    ctx = cfg.ctx or model.cfg.n_ctx
    if ctx > model.cfg.n_ctx:
        raise TrainConfigError(f"SparseTrainConfig.ctx ({ctx}) exceeds the model's n_ctx ({model.cfg.n_ctx})")
    train = _check_tokens(train_tokens, "train_tokens", ctx, model.cfg.d_vocab)
    held = None if heldout_tokens is None else _check_tokens(heldout_tokens, "heldout_tokens", ctx, model.cfg.d_vocab)
    out = None if out is None else Path(out)
    held_windows = None if held is None else eval_windows(held, ctx, cfg.eval_windows)

    def loss_fn(batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def project(trainer) -> dict:
        density = density_schedule(trainer.step, cfg)
        _project(model, density, cfg.min_per_unit)
        return {"density": density}

    evals = ()
    if held_windows is not None and cfg.eval_every:
        evals = (Eval("evals", lambda t: {"heldout_loss": lm_loss(model, held_windows, cfg.batch)},
                      every=cfg.eval_every, at={cfg.steps}),)
    identity = {**{k: getattr(cfg, k) for k in _IDENTITY_FIELDS},
                "train_tokens": _fingerprint(train), "heldout_tokens": _fingerprint(held)}
    trainer = Trainer(model, cfg.optim(), lambda step: batch_windows(train, ctx, cfg.batch, cfg.seed, step), loss_fn,
                      path=None if out is None else out / "train_state", identity=identity,
                      decay=_is_matrix, post_step=project, evals=evals,
                      checkpoint_every=cfg.checkpoint_every or cfg.eval_every, threads=cfg.threads,
                      progress=progress, desc="train_lm")
    r = trainer.run(stop_after=stop_after, budget_s=budget_s)
    history, evals_done = r.history_records(), r.metrics.get("evals", [])
    result = {
        "history": history, "evals": evals_done,
        "train_loss": lm_loss(model, eval_windows(train, ctx, cfg.eval_windows), cfg.batch),
        "heldout_loss": None if held_windows is None else lm_loss(model, held_windows, cfg.batch),
        "densities": nonzero_fraction(model, matrices_only=True), "density_target": density_schedule(r.step, cfg),
        "steps_done": r.step, "finished": r.finished, "seconds": r.seconds, "seconds_per_step": r.seconds_per_step,
        "checkpoint": None if r.path is None else str(r.path),
    }
    if out is not None:
        (out / "history.json").write_text(json.dumps({"history": history, "evals": evals_done}))
        (out / "summary.json").write_text(json.dumps({k: v for k, v in result.items() if k not in ("history", "evals")},
                                                     indent=2))
    return result


__all__ = [
    "RESIDUAL_AXIS",
    "SparseTrainConfig",
    "batch_windows",
    "density_allowance",
    "density_schedule",
    "eval_windows",
    "lm_config",
    "lm_loss",
    "lr_schedule",
    "nonzero_fraction",
    "project_topk",
    "sparse_parameters",
    "topk_mask",
    "train_lm",
]
