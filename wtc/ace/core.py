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
from dataclasses import dataclass

import torch
from torch import nn

from wtc.ace.balanced import balanced_svd, balanced_truncation, rank_for_energy
from wtc.ace.gramians import GramianAccumulator
from wtc.hooks import hook_modules
from wtc.errors import AceError


@dataclass
class Core:
    layer: str
    position: int | str | None
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
        r = self.rank if rank is None else rank
        if kind == "orthogonal":
            Q = self.basis[:, :r]
            return Q @ Q.T
        if kind == "oblique":
            if self.right is None:
                raise AceError("this core has no balancing pair (cores from extract_core have one)")
            return self.right[:, :r] @ self.left[:, :r].T
        raise AceError(f"projector kind must be 'orthogonal' or 'oblique', got {kind!r}")

    def project(self, h: torch.Tensor, rank: int | None = None) -> torch.Tensor:
        """Core coordinates (..., rank) of activations (..., D), centred."""
        Q = self.basis[:, : self.rank if rank is None else rank]
        return (h.double() - self.mean) @ Q


def _logits(out):
    """A model's output as the readout sees it: a tensor as is; a Hugging Face ModelOutput (or any
    output with a `.logits` tensor) by its logits."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else out


def _select(act: torch.Tensor, position) -> torch.Tensor:
    """The samples of a module output: (B, D) as is; one position of (B, T, D); or, for
    position="all", every position as its own sample ((B*T, D))."""
    if position is None:
        return act
    if position == "all":
        return act.reshape(-1, act.shape[-1])
    return act[:, position]


def activations_and_jacobians(model, inputs, layer: str, readout, position: int | None = -1):
    """(H (n, D), J (n, K, D)) for one chunk of inputs."""
    captured = {}

    def grab(out, module):
        act = out.detach().clone().requires_grad_(True)
        captured["act"] = act
        return act

    with hook_modules(model, [(layer, grab)]), torch.enable_grad():
        y = readout(_logits(model(inputs)))
        if position == "all":
            y = y.reshape(-1, y.shape[-1])                       # (B*T, K): position t reads act[:, t]
        if y.ndim != 2:
            raise AceError(f"readout must give (batch, K) outputs, got {tuple(y.shape)}")
        act = captured["act"]
        if position is not None and act.ndim != 3:
            raise AceError(f"module {layer!r} output is {tuple(act.shape)}; pass position=None for (batch, D)")
        # one backward per output k over the whole chunk: sample i's gradient is its own
        # Jacobian row because samples do not interact (batch elements; with position="all",
        # positions after the last layer that mixes them, e.g. the final residual stream)
        grads = [torch.autograd.grad(y[:, k].sum(), act, retain_graph=k + 1 < y.shape[1])[0]
                 for k in range(y.shape[1])]
    J = torch.stack([_select(g, position) for g in grads], 1)                 # (n, K, D)
    return _select(act.detach(), position), J


def _default_readout(position):
    if position == "all":
        return lambda out: out
    return lambda out: out[:, -1] if out.ndim == 3 else out


def extract_core(model: nn.Module, inputs, layer: str, readout=None, energy: float = 0.99,
                 rank: int | None = None, position: int | str | None = -1, chunk: int = 512) -> Core:
    """The core of `layer`: smallest rank reaching `energy` of s^2 (or the given rank).

    position: -1 (default) the last position of a (B, T, D) output, None for (B, D) outputs, or
    "all": every position a sample, with readout (B, T, K) read at the same position."""
    _check_position(position)
    _check_chunk(chunk)
    if not isinstance(layer, str):
        raise AceError(f"layer must be a module path (str), e.g. 'blocks.0.hook_resid_post', got {layer!r}")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise AceError(f"rank must be None or a non-negative integer, got {rank!r}")
    if len(inputs) == 0:
        raise AceError("inputs are empty")
    readout = readout or _default_readout(position)
    acc = None
    for start in range(0, len(inputs), chunk):
        H, J = activations_and_jacobians(model, inputs[start:start + chunk], layer, readout, position)
        if acc is None:
            acc = GramianAccumulator(H.shape[-1])
        acc.add(H, J)
    if acc is None:
        raise AceError("inputs are empty")
    cov, obs = acc.covariance(), acc.observability()
    basis, s = balanced_svd(cov, obs)
    right, left, _ = balanced_truncation(cov, obs)
    r = rank_for_energy(s, energy) if rank is None else int(rank)
    if not 0 <= r <= basis.shape[1]:
        raise AceError(f"rank {r} out of range: the balanced SVD has {basis.shape[1]} nonzero directions")
    return Core(layer, position, basis, s, r, acc.mean, acc.n, right, left)


PATCH_MODES = ("keep", "remove", "flip")


def _check_position(position) -> None:
    if not (position is None or position == "all" or (isinstance(position, int) and not isinstance(position, bool))):
        raise AceError(f"position must be an int (e.g. -1, the last position), None for (batch, D) outputs, "
                       f"or 'all', got {position!r}")


def _check_chunk(chunk) -> None:
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise AceError(f"chunk must be a positive integer, got {chunk!r}")


def _check_labels(labels: torch.Tensor, inputs, core) -> None:
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise AceError(f"labels must be integer class ids (-1: not scored), got dtype {labels.dtype}")
    if labels.ndim < 1 or len(labels) != len(inputs):
        raise AceError(f"labels must have one row per input: {len(inputs)} inputs, labels of shape {tuple(labels.shape)}")
    if core.position == "all" and labels.ndim != 2:
        raise AceError(f"a position='all' core is scored per position: labels must be (batch, T), got {tuple(labels.shape)}")
    if bool((labels < -1).any()):
        raise AceError(f"labels are class ids >= 0, or -1 for 'not scored'; got {int(labels.min())}")
    if not (labels >= 0).any():
        raise AceError("no label is scored (every label is -1)")


def _patch_hook(core: Core, mode: str, rank: int | None, projector: str = "orthogonal"):
    """Hook fn (wtc.hooks) replacing the core's samples h of the layer output: keep = mu + P (h - mu),
    remove = h - P (h - mu), flip = h - 2 P (h - mu), with P the rank-r core projector of `projector`
    kind (orthogonal or oblique)."""
    P, mu = core.projector(rank, projector), core.mean

    def patch(h):
        d = (h.double() - mu) @ P.T                                  # rows: (P (h - mu))^T
        new = {"keep": mu + d, "remove": h.double() - d, "flip": h.double() - 2 * d}[mode]
        return new.to(h.dtype)

    def hook(out, module):
        if core.position is None or core.position == "all":
            return patch(out)
        out = out.clone()
        out[:, core.position] = patch(out[:, core.position])
        return out

    return hook


def _patched(model, core: Core, mode: str, rank: int | None, projector: str = "orthogonal"):
    return hook_modules(model, [(core.layer, _patch_hook(core, mode, rank, projector))])


@torch.no_grad()
def patched_accuracy(model, inputs, labels, core: Core, mode: str, rank: int | None = None, readout=None,
                     chunk: int = 2048, projector: str = "orthogonal") -> float:
    """Accuracy (argmax of the readout) with the layer patched: 'clean', 'keep', 'remove' or 'flip'."""
    if mode not in ("clean",) + PATCH_MODES:
        raise AceError(f"mode must be clean, keep, remove or flip, got {mode!r}")
    labels = torch.as_tensor(labels)
    _check_labels(labels, inputs, core)
    _check_chunk(chunk)
    readout = readout or _default_readout(core.position)
    hits = 0
    with _patched(model, core, mode, rank, projector) if mode != "clean" else contextlib.nullcontext():
        for start in range(0, len(inputs), chunk):
            pred = readout(_logits(model(inputs[start:start + chunk]))).argmax(-1)
            lab = labels[start:start + chunk]
            hits += int(((pred == lab) & (lab >= 0)).sum())          # label -1: not scored
    return hits / int((labels >= 0).sum())


@torch.no_grad()
def keep_kl(model, inputs, core: Core, rank: int, readout=None, chunk: int = 2048,
            projector: str = "orthogonal") -> float:
    """Mean KL(clean || kept) of the readout's softmax when only the rank-r core is kept: whether
    the core carries the whole output distribution, not just its argmax."""
    readout = readout or _default_readout(core.position)
    total, count = 0.0, 0
    for start in range(0, len(inputs), chunk):
        x = inputs[start:start + chunk]
        clean = torch.log_softmax(readout(_logits(model(x))).double(), -1)
        with _patched(model, core, "keep", rank, projector):
            kept = torch.log_softmax(readout(_logits(model(x))).double(), -1)
        kl = (clean.exp() * (clean - kept)).sum(-1)
        total += float(kl.sum())
        count += kl.numel()
    return total / count


def validate(core: Core, model, inputs, labels, readout=None, tolerance: float = 0.005,
             projector: str = "orthogonal") -> dict:
    """Keep / remove / flip accuracies at the core's rank, and the minimal sufficient rank (keep
    within `tolerance` of baseline) and minimal necessary rank (remove <= 2 x chance), with the
    `projector` kind: "orthogonal" (onto the core subspace) or "oblique" (balanced truncation)."""
    labels = torch.as_tensor(labels)
    _check_labels(labels, inputs, core)
    with torch.no_grad():
        K = (readout or _default_readout(core.position))(_logits(model(inputs[:1]))).shape[-1]
    if int(labels.max()) >= K:
        raise AceError(f"label {int(labels.max())} is not a class of the readout's {K} outputs")
    if not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool) or not 0 <= tolerance < 1:
        raise AceError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
    chance = 1.0 / K
    acc = {m: patched_accuracy(model, inputs, labels, core, m, readout=readout, projector=projector)
           for m in ("clean", "keep", "remove", "flip")}
    sufficient = necessary = None
    for r in range(0, core.basis.shape[1] + 1):
        if sufficient is None and patched_accuracy(model, inputs, labels, core, "keep", r, readout, projector=projector) >= acc["clean"] - tolerance:
            sufficient = r
        if necessary is None and patched_accuracy(model, inputs, labels, core, "remove", r, readout, projector=projector) <= 2 * chance:
            necessary = r
        if sufficient is not None and necessary is not None:
            break
    return {"baseline_acc": acc["clean"], "keep_acc": acc["keep"], "remove_acc": acc["remove"],
            "flip_acc": acc["flip"], "chance": chance, "rank": core.rank,
            "minimal_sufficient_rank": sufficient, "minimal_necessary_rank": necessary}
