"""ACE: the algorithmic core of a layer and its causal validation.

extract_core(model, inputs, layer, readout) streams activations H and readout Jacobians J of the
named module (position `position` of a sequence output) through float64 Gramians and keeps the
top of their balanced SVD. validate(...) patches the layer's output in a forward hook: keep =
mu + P (h - mu), remove = h - P (h - mu), flip = h - 2 P (h - mu), with P the core projector.
Hooks go on a named module through wtc.hooks.hook_modules, so wtc models, any nn.Module, Hugging
Face models (tuple outputs: element 0; a model output with `.logits` reaches the readout as its
logits; wtc.models.hf adds TL-style names) and TransformerLens models (module names such as
"blocks.0.hook_resid_post") work alike. Models must treat batch elements independently (no batch
norm in training mode): per-input Jacobians come from one backward pass per readout output over a
whole chunk.
"""
from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from wtc.arguments import float_readout
from wtc.ace.balanced import balanced_svd, balanced_truncation, rank_for_energy
from wtc.ace.gramians import GramianAccumulator
from wtc.hooks import hook_modules
from wtc.errors import AceError


@dataclass
class Core:
    """An algorithmic core of `layer` (at `position`): the `rank`-dimensional subspace that is both
    active and output-relevant, as an orthonormal `basis` (D, m) ordered by the balanced singular
    values `s`, the activation `mean` it is centred on, the `n_samples` it was estimated from and
    the balancing pair (`right`, `left`) of its oblique projector. `extract_core` returns it."""
    layer: str
    position: int | str | torch.Tensor | None    # a (n,) tensor: per-input positions
    basis: torch.Tensor        # (D, m) orthonormal, ordered by singular value
    s: torch.Tensor            # (m,) balanced singular values; weights are s^2
    rank: int
    mean: torch.Tensor         # (D,) activation mean
    n_samples: int
    right: torch.Tensor | None = None   # (D, m) balancing transformation T (oblique projector T_r W_r^T)
    left: torch.Tensor | None = None    # (D, m) its dual W, W^T T = I

    @property
    def Q(self) -> torch.Tensor:
        """(D, rank) core basis."""
        return self.basis[:, : self.rank]

    def projector(self, rank: int | None = None, kind: str = "orthogonal") -> torch.Tensor:
        """(D, D) rank-r projector P (P h projects a column h). orthogonal: Q_r Q_r^T onto the core
        subspace; oblique: T_r W_r^T, the same range, whose null space holds the unobservable and
        the other balanced directions (balanced truncation)."""
        r = self._rank(rank)
        if kind == "orthogonal":
            Q = self.basis[:, :r]
            return Q @ Q.T
        if kind == "oblique":
            if self.right is None:
                raise AceError("this core has no balancing pair (cores from extract_core have one)")
            return self.right[:, :r] @ self.left[:, :r].T
        raise AceError(f"projector kind must be 'orthogonal' or 'oblique', got {kind!r}")

    def _rank(self, rank) -> int:
        """rank as an int in [0, basis columns] (a negative one would slice from the end)."""
        if rank is None:
            return self.rank
        top = self.basis.shape[1]
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank <= top:
            raise AceError(f"rank must be an integer in [0, {top}] (this core's basis), got {rank!r}")
        return int(rank)

    def project(self, h: torch.Tensor, rank: int | None = None) -> torch.Tensor:
        """Core coordinates (..., rank) of activations (..., D), centred."""
        Q = self.basis[:, : self._rank(rank)]
        if not torch.is_tensor(h) or h.ndim < 1 or h.shape[-1] != Q.shape[0]:
            raise AceError(f"activations must be (..., {Q.shape[0]}) (this core's layer width), got "
                           f"{tuple(h.shape) if torch.is_tensor(h) else type(h).__name__}")
        if h.dtype.is_complex:
            raise AceError(f"activations are complex ({h.dtype}); a core projects real activations")
        return (h.double() - self.mean) @ Q


def _logits(out):
    """A model's output as the readout sees it: a tensor as is; a Hugging Face ModelOutput (or any
    output with a `.logits` tensor) by its logits."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else out


def _per_input(position) -> bool:
    """Whether `position` gives one position per input (a 1-D integer tensor)."""
    return isinstance(position, torch.Tensor)


def _is_all(position) -> bool:
    return isinstance(position, str) and position == "all"


def _select(act: torch.Tensor, position) -> torch.Tensor:
    """The samples of a module output: (B, D) as is; one position of (B, T, D); for a per-input
    position tensor (B,), input i's position[i]; or, for position="all", every position as its own
    sample ((B*T, D))."""
    if position is None:
        return act
    if _is_all(position):
        return act.reshape(-1, act.shape[-1])
    _check_in_range(position, act)
    if _per_input(position):
        return act[torch.arange(act.shape[0], device=act.device), position.to(act.device)]
    return act[:, position]


def _check_in_range(position, act: torch.Tensor) -> None:
    """AceError for a position (an int or per-input tensor) outside the output's T positions."""
    if act.ndim < 3:
        raise AceError(f"a position was given, but the layer's output has shape {tuple(act.shape)} (no positions); "
                       "use position=None")
    T = act.shape[1]
    lo, hi = (int(position.min()), int(position.max())) if _per_input(position) else (position, position)
    if lo < -T or hi >= T:
        raise AceError(f"position {lo if lo < -T else hi} is outside the layer output's {T} positions")


def _read(readout, out, position):
    """The readout of a model output; with per-input positions, of the output at those positions."""
    out = _logits(out)
    if _per_input(position):
        if not isinstance(out, torch.Tensor) or out.ndim < 2 or out.shape[0] != len(position):
            raise AceError(f"with per-input positions the model output must be (batch, T, ...), got "
                           f"{tuple(getattr(out, 'shape', ()))}")
        out = _select(out, position)
    return float_readout(readout, out, AceError)


def activations_and_jacobians(model, inputs, layer: str, readout, position: int | None = -1):
    """(H (n, D), J (n, K, D)) for one chunk of inputs."""
    captured = {}

    def grab(out, module):
        act = out.detach().clone().requires_grad_(True)
        captured["act"] = act
        return act

    with hook_modules(model, [(layer, grab)]), torch.enable_grad():
        y = _read(readout, model(inputs), position)
        if _is_all(position):
            y = y.reshape(-1, y.shape[-1])                       # (B*T, K): position t reads act[:, t]
        if y.ndim != 2:
            raise AceError(f"readout must give (batch, K) outputs, got {tuple(y.shape)}")
        act = captured["act"]
        if position is not None and act.ndim != 3:
            raise AceError(f"module {layer!r} output is {tuple(act.shape)}; pass position=None for (batch, D)")
        # one backward per output k over the whole chunk: sample i's gradient is its own
        # Jacobian row because samples do not interact (batch elements; with position="all",
        # positions after the last layer that mixes them, e.g. the final residual stream)
        if not y.requires_grad:
            raise AceError(f"the readout's output does not depend on {layer!r} through autograd (detached, or "
                           "computed without gradients): ACE needs its Jacobian")
        if not torch.isfinite(y).all():
            raise AceError("the readout holds NaN or inf for these inputs")
        grads = [torch.autograd.grad(y[:, k].sum(), act, retain_graph=k + 1 < y.shape[1], allow_unused=True)[0]
                 for k in range(y.shape[1])]
        grads = [torch.zeros_like(act) if g is None else g for g in grads]
    J = torch.stack([_select(g, position) for g in grads], 1)                 # (n, K, D)
    return _select(act.detach(), position), J


def _check_readout_per_row(model, inputs, readout, position) -> None:
    """AceError when the readout mixes the batch (o - o.mean(0), a softmax over axis 0): ACE reads
    each input's Jacobian from one backward over the batch, so row i of the readout must depend on
    input i alone. Tested on one model output: the readout of its first rows alone must equal the
    first rows of the readout of all of them (o - o.mean(0) read as "does not depend on the layer")."""
    m = min(len(inputs), 4)
    if m < 2:
        return
    with torch.no_grad():
        out = _logits(model(inputs[:m]))
        if not isinstance(out, torch.Tensor):
            return
        whole = _read(readout, out, position[:m] if _per_input(position) else position)
        part = _read(readout, out[: m - 1], position[: m - 1] if _per_input(position) else position)
    if whole.shape[1:] != part.shape[1:] or len(whole) != m or len(part) != m - 1:
        raise AceError(f"the readout mixes the batch: it gave {tuple(whole.shape)} for {m} inputs and "
                       f"{tuple(part.shape)} for {m - 1}; it must map each input's output on its own (row i from input i)")
    a, b = whole[: m - 1].double(), part.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return                  # named below, per chunk, as a readout holding NaN or inf
    if not torch.allclose(a, b, rtol=1e-4, atol=1e-5 * (1 + float(a.abs().max()))):
        raise AceError("the readout mixes the batch (its rows for the first inputs change when other inputs are in "
                       "the batch, e.g. o - o.mean(0)); it must map each input's output on its own (row i from input i)")


def _default_readout(position):
    if _is_all(position) or _per_input(position):
        return lambda out: out
    return lambda out: out[:, -1] if out.ndim == 3 else out


def _in_eval_mode(model_arg: int):
    """Run the decorated function with the model (positional argument `model_arg`, or model=) in
    eval mode, every submodule's mode restored after: in train mode dropout would make the
    activations, Jacobians and accuracies noise (a core of another rank, a baseline of 0.81 for 1.0)."""
    import functools

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            model = args[model_arg] if len(args) > model_arg else kwargs.get("model")
            if not isinstance(model, nn.Module):
                return fn(*args, **kwargs)
            modes = [(m, m.training) for m in model.modules()]
            model.eval()
            try:
                return fn(*args, **kwargs)
            finally:
                for m, training in modes:
                    m.training = training
        return run
    return wrap


@_in_eval_mode(0)
def extract_core(model: nn.Module, inputs, layer: str, readout=None, energy: float = 0.99,
                 rank: int | None = None, position: int | str | None = -1, chunk: int = 512) -> Core:
    """The core of `layer`: smallest rank reaching `energy` of s^2 (or the given rank).

    position: -1 (default) the last position of a (B, T, D) output, None for (B, D) outputs,
    "all": every position a sample, with readout (B, T, K) read at the same position, or a 1-D
    integer tensor of one position per input (sentences of different lengths): input i is read
    at position[i], and the readout gets the model output at the same positions ((B, V) -> (B, K)).
    The core keeps these positions; validate / patched_accuracy / keep_kl patch at them (or at the
    `positions` they are given for other inputs)."""
    position, rank, chunk, energy = _int(position), _int(rank), _int(chunk), _real(energy)
    position = _check_position(position, len(inputs))
    _check_chunk(chunk)
    if not isinstance(layer, str):
        raise AceError(f"layer must be a module path (str), e.g. 'blocks.0.hook_resid_post', got {layer!r}")
    if not isinstance(model, nn.Module):
        raise AceError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise AceError(f"rank must be None or a non-negative integer, got {rank!r}")
    if isinstance(energy, bool) or not isinstance(energy, (int, float)) or not 0 < energy <= 1:
        raise AceError(f"energy must be a number in (0, 1], got {energy!r}")
    if len(inputs) == 0:
        raise AceError("inputs are empty")
    readout = readout or _default_readout(position)
    _check_readout_per_row(model, inputs, readout, position)
    acc = None
    for start in range(0, len(inputs), chunk):
        H, J = activations_and_jacobians(model, inputs[start:start + chunk], layer, readout,
                                         position[start:start + chunk] if _per_input(position) else position)
        if acc is None:
            acc = GramianAccumulator(H.shape[-1])
        acc.add(H, J)
    if acc is None:
        raise AceError("inputs are empty")
    cov, obs = acc.covariance(), acc.observability()
    if not bool((obs != 0).any()):
        raise AceError(f"the readout does not depend on {layer} on these inputs (its Jacobian there is zero): "
                       "there is no core to find")
    basis, s = balanced_svd(cov, obs)
    right, left, _ = balanced_truncation(cov, obs)
    r = rank_for_energy(s, energy) if rank is None else int(rank)
    if not 0 <= r <= basis.shape[1]:
        raise AceError(f"rank {r} out of range: the balanced SVD has {basis.shape[1]} nonzero directions")
    return Core(layer, position, basis, s, r, acc.mean, acc.n, right, left)


PATCH_MODES = ("keep", "remove", "flip")


def _int(value):
    """A numpy integer as an int (np.int64(2) is a rank as 2 is); anything else unchanged."""
    return int(value) if isinstance(value, np.integer) else value


def _real(value):
    """A numpy float or integer as a Python number; anything else unchanged."""
    return value.item() if isinstance(value, (np.floating, np.integer)) else value


def _check_core(core) -> None:
    if not isinstance(core, Core):
        raise AceError(f"core must be a Core (from extract_core), got {type(core).__name__}")


def _as_labels(labels) -> torch.Tensor:
    try:
        labels = torch.as_tensor(labels)
    except (TypeError, ValueError, RuntimeError) as exc:     # ragged lists, text
        raise AceError(f"labels must be an integer array of class ids (one per input), got "
                       f"{type(labels).__name__} that is not one ({exc})") from None
    if labels.dtype.is_complex:
        raise AceError(f"labels must be integer class ids (-1: not scored), got dtype {labels.dtype}")
    return labels


def _check_position(position, n: int | None = None):
    """The position, checked (a per-input one as an int64 tensor of n entries)."""
    if _per_input(position) or isinstance(position, (list, tuple, np.ndarray)):
        try:
            pos = torch.as_tensor(position)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise AceError(f"per-input positions must be a 1-D integer tensor, got {type(position).__name__} "
                           f"that is not one ({exc})") from None
        if pos.ndim != 1 or pos.dtype.is_floating_point or pos.dtype == torch.bool or pos.dtype.is_complex:
            raise AceError(f"per-input positions must be a 1-D integer tensor, got {tuple(pos.shape)} {pos.dtype}")
        if n is not None and len(pos) != n:
            raise AceError(f"per-input positions: {len(pos)} positions for {n} inputs")
        return pos.long()
    if not (position is None or _is_all(position) or (isinstance(position, int) and not isinstance(position, bool))):
        raise AceError(f"position must be an int (e.g. -1, the last position), None for (batch, D) outputs, "
                       f"'all', or a 1-D tensor of per-input positions, got {position!r}")
    return position


def _check_chunk(chunk) -> None:
    chunk = _int(chunk)
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise AceError(f"chunk must be a positive integer, got {chunk!r}")


def _check_labels(labels: torch.Tensor, inputs, core) -> None:
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise AceError(f"labels must be integer class ids (-1: not scored), got dtype {labels.dtype}")
    if labels.ndim < 1 or len(labels) != len(inputs):
        raise AceError(f"labels must have one row per input: {len(inputs)} inputs, labels of shape {tuple(labels.shape)}")
    if _is_all(core.position) and labels.ndim != 2:
        raise AceError(f"a position='all' core is scored per position: labels must be (batch, T), got {tuple(labels.shape)}")
    if bool((labels < -1).any()):
        raise AceError(f"labels are class ids >= 0, or -1 for 'not scored'; got {int(labels.min())}")
    if not (labels >= 0).any():
        raise AceError("no label is scored (every label is -1)")


def _patch_hook(core: Core, mode: str, rank: int | None, projector: str = "orthogonal", positions=None):
    """Hook fn (wtc.hooks) replacing the core's samples h of the layer output: keep = mu + P (h - mu),
    remove = h - P (h - mu), flip = h - 2 P (h - mu), with P the rank-r core projector of `projector`
    kind (orthogonal or oblique); at `positions` (B,) per input when given."""
    P, mu = core.projector(rank, projector), core.mean

    def patch(h):
        d = (h.double() - mu) @ P.T                                  # rows: (P (h - mu))^T
        new = {"keep": mu + d, "remove": h.double() - d, "flip": h.double() - 2 * d}[mode]
        return new.to(h.dtype)

    def hook(out, module):
        if positions is not None:
            if out.shape[0] != len(positions):
                raise AceError(f"per-input positions: {len(positions)} positions for a batch of {out.shape[0]}")
            _check_in_range(positions, out)
            rows = torch.arange(out.shape[0], device=out.device)
            out = out.clone()
            out[rows, positions] = patch(out[rows, positions])
            return out
        if core.position is None or _is_all(core.position):
            return patch(out)
        _check_in_range(core.position, out)
        out = out.clone()
        out[:, core.position] = patch(out[:, core.position])
        return out

    return hook


def _patched(model, core: Core, mode: str, rank: int | None, projector: str = "orthogonal", positions=None):
    return hook_modules(model, [(core.layer, _patch_hook(core, mode, rank, projector, positions))])


def patched(model, core: Core, mode: str, rank: int | None = None, projector: str = "orthogonal", positions=None):
    """A context in which `model` runs with the core's layer patched ('keep', 'remove' or 'flip'),
    at the core's position, or at `positions` (B,) per input for a batch of B (e.g. the position
    that predicts a verb, kept fixed while greedy generation grows the sequence)."""
    if mode not in PATCH_MODES:
        raise AceError(f"mode must be keep, remove or flip, got {mode!r}")
    if positions is not None:
        positions = _check_position(torch.as_tensor(positions))
    elif _per_input(core.position):
        raise AceError("this core has per-input positions: pass positions= for the batch being patched")
    return _patched(model, core, mode, rank, projector, positions)


def _positions_for(core: Core, inputs, positions):
    """Per-input positions for `inputs`: the given ones, else the core's own when it has them."""
    if positions is not None:
        return _check_position(torch.as_tensor(positions), len(inputs))
    if _per_input(core.position):
        if len(core.position) != len(inputs):
            raise AceError(f"this core has per-input positions for {len(core.position)} inputs, not "
                           f"{len(inputs)}: pass positions= for these inputs")
        return core.position
    return None


@_in_eval_mode(0)
@torch.no_grad()
def patched_accuracy(model, inputs, labels, core: Core, mode: str, rank: int | None = None, readout=None,
                     chunk: int = 2048, projector: str = "orthogonal", positions=None) -> float:
    """Accuracy (argmax of the readout) with the layer patched: 'clean', 'keep', 'remove' or 'flip'.
    positions: per-input positions of these inputs (default: the core's, for a core with them)."""
    if mode not in ("clean",) + PATCH_MODES:
        raise AceError(f"mode must be clean, keep, remove or flip, got {mode!r}")
    _check_core(core)
    labels = _as_labels(labels)
    _check_labels(labels, inputs, core)
    _check_chunk(chunk)
    chunk = int(chunk)
    pos = _positions_for(core, inputs, positions)
    readout = readout or _default_readout(core.position)
    hits = 0
    for start in range(0, len(inputs), chunk):
        p = None if pos is None else pos[start:start + chunk]
        with _patched(model, core, mode, rank, projector, p) if mode != "clean" else contextlib.nullcontext():
            logits = _read(readout, model(inputs[start:start + chunk]), p)
        pred, K = logits.argmax(-1), logits.shape[-1]
        lab = labels[start:start + chunk]
        if pred.shape != lab.shape:                  # (B, 1) against (B,) would broadcast to (B, B)
            raise AceError(f"labels of shape {tuple(labels.shape)} do not match the readout's predictions, "
                           f"shaped {(len(labels),) + tuple(pred.shape[1:])}")
        if int(lab.max()) >= K:
            raise AceError(f"label {int(lab.max())} is not a class of the readout's {K} outputs")
        hits += int(((pred == lab) & (lab >= 0)).sum())              # label -1: not scored
    return hits / int((labels >= 0).sum())


@_in_eval_mode(0)
@torch.no_grad()
def keep_kl(model, inputs, core: Core, rank: int, readout=None, chunk: int = 2048,
            projector: str = "orthogonal", positions=None) -> float:
    """Mean KL(clean || kept) of the readout's softmax when only the rank-r core is kept: whether
    the core carries the whole output distribution, not just its argmax."""
    _check_core(core)
    _check_chunk(chunk)
    chunk = int(chunk)
    if len(inputs) == 0:
        raise AceError("inputs are empty: a mean KL needs at least one input")
    core._rank(rank)                              # a bad rank is named before anything runs
    pos = _positions_for(core, inputs, positions)
    readout = readout or _default_readout(core.position)
    total, count = 0.0, 0
    for start in range(0, len(inputs), chunk):
        x = inputs[start:start + chunk]
        p = None if pos is None else pos[start:start + chunk]
        clean = torch.log_softmax(_read(readout, model(x), p).double(), -1)
        with _patched(model, core, "keep", rank, projector, p):
            kept = torch.log_softmax(_read(readout, model(x), p).double(), -1)
        kl = (clean.exp() * (clean - kept)).sum(-1)
        total += float(kl.sum())
        count += kl.numel()
    return total / count


@_in_eval_mode(1)
def validate(core: Core, model, inputs, labels, readout=None, tolerance: float = 0.005,
             projector: str = "orthogonal", positions=None) -> dict:
    """Keep / remove / flip accuracies at the core's rank, and the minimal sufficient rank (keep
    within `tolerance` of baseline) and minimal necessary rank (remove within a tenth of the way from
    chance to baseline, and <= 2 x chance), with the
    `projector` kind: "orthogonal" (onto the core subspace) or "oblique" (balanced truncation).
    positions: per-input positions of these inputs (default: the core's, for a core with them)."""
    _check_core(core)
    labels = _as_labels(labels)
    tolerance = _real(tolerance)
    _check_labels(labels, inputs, core)
    positions = _positions_for(core, inputs, positions)
    with torch.no_grad():
        K = _read(readout or _default_readout(core.position), model(inputs[:1]),
                  None if positions is None else positions[:1]).shape[-1]
    if int(labels.max()) >= K:
        raise AceError(f"label {int(labels.max())} is not a class of the readout's {K} outputs")
    if not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool) or not 0 <= tolerance < 1:
        raise AceError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
    # chance: what a constant answer scores on these labels (1/K when they are balanced);
    # "necessary": removal leaves at most chance plus a tenth of the way to baseline, and at most
    # 2 x chance (with 2 classes 2 x chance alone is 1.0, which every removal passes)
    scored = labels[labels >= 0].long()                      # label -1: not scored
    chance = max(1.0 / K, float(torch.bincount(scored).max()) / scored.numel())
    acc = {m: patched_accuracy(model, inputs, labels, core, m, readout=readout, projector=projector,
                                 positions=positions)
           for m in ("clean", "keep", "remove", "flip")}
    near_chance = min(2 * chance, chance + 0.1 * max(acc["clean"] - chance, 0.0))
    sufficient = necessary = None
    for r in range(0, core.basis.shape[1] + 1):
        if sufficient is None and patched_accuracy(model, inputs, labels, core, "keep", r, readout, projector=projector, positions=positions) >= acc["clean"] - tolerance:
            sufficient = r
        if necessary is None and patched_accuracy(model, inputs, labels, core, "remove", r, readout, projector=projector, positions=positions) <= near_chance:
            necessary = r
        if sufficient is not None and necessary is not None:
            break
    return {"baseline_acc": acc["clean"], "keep_acc": acc["keep"], "remove_acc": acc["remove"],
            "flip_acc": acc["flip"], "chance": chance, "rank": core.rank,
            "minimal_sufficient_rank": sufficient, "minimal_necessary_rank": necessary}
