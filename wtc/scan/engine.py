"""Per-weight ablation scan: for every nonzero weight, the exact per-position KL(clean || zeroed).

How each parameter is evaluated (all exact, never estimated):
- closed form for the unembedding (the last linear map to the logits: zeroing W[v, j] moves one
  logit by W[v, j] h_j; wtc._C computes every (v, j) at every position without ablated logits);
- wtc Transformers' weight matrices (wtc.scan.suffix): the change a zeroed weight makes to the
  residual stream is computed from cached clean activations (rank-1 for MLP weights, W_O and W_V;
  one head recomputed for W_Q / W_K; embedding rows only where the token / position reaches), and
  only what follows it is run, as one batch of copies; their biases and norm weights run the
  blocks from the cached residual stream entering their block;
- TransformerLens HookedTransformers that a wtc Transformer can express are scanned through
  their wtc twin (same parameter names; used only when its logits match on the tokens);
- any other nn.Module (other TransformerLens models included): wtc.scan.generic chooses per parameter
  between one forward of A copies of the tokens with the zeroed weights applied by hooks on the
  modules holding the parameter (nn.Linear, nn.Embedding, norms, GPT-2's Conv1D), A copies of the
  parameter through torch.func.vmap(functional_call(model, ...)), and the naive loop; then the readout.
Results stream to a SQLite store chunk by chunk (wtc.scan.store), so a killed scan resumes.
With torch.distributed initialised, chunks are shared round-robin across ranks and merged.
"""
from __future__ import annotations

import numbers
import os
import hashlib
import re
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import nn
from torch.func import functional_call, vmap
from tqdm.auto import tqdm

from wtc.hooks import has_hooks, hook_modules
from wtc.errors import ScanError, UnknownName
from wtc.arguments import float_readout
from wtc.scan.inputs import architecture, default_readout, as_tokens, hooks_identity, model_sha256, positive_int, readout_identity
from wtc.scan.generic import Generic
from wtc.scan.kl import importance_positions, kl_rows, kl_unembed
from wtc.scan import bridge_names
from wtc.scan.names import Params, resolve, select as _select_params, wrapper_prefix
from wtc.scan.result import ScanResult
from wtc.scan.store import ScanStore, check_space, disk_estimate
from wtc.progress import enable, log
from wtc.scan.suffix import Suffix

CHUNK = 4096                 # weights per committed chunk: the unit of resume and of sharding
KEEP_POSITIONS_BYTES = 2**30  # keep full per-position KL in the store while it stays under 1 GiB
ACTIVATION_BUDGET = 2**25    # floats per batch of ablated copies (~128 MiB of float32): on 2 CPU
                             # cores batches of 1-4 copies ran fastest (bench/RESULTS.md)
GPU_ACTIVATION_BUDGET = 2**28  # ~1 GiB: a GPU needs many copies per launch to fill its SMs


def _checked(readout):
    """A user readout whose result is checked: a tuple or integer logits would fail obscurely or
    be scored after truncation."""
    return lambda out: float_readout(readout, out, ScanError)


def _fingerprint(model: nn.Module, tokens: torch.Tensor) -> dict:
    return {"model_sha256": model_sha256(model), "tokens_sha256": hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest(),
            "tokens_shape": list(tokens.shape)}


class _Evaluator:
    """Clean pass, caches, and ablated logits for a batch of weights of one parameter."""

    def __init__(self, model: nn.Module, tokens: torch.Tensor, readout):
        self.model, self.tokens = model, tokens
        self.readout = default_readout if readout is None else _checked(readout)
        self.readout_given = readout
        self.counted = None          # (N,) bool: positions whose KL counts (scan(positions=...)); None: all
        # prefix caching needs wtc's split forward and logits as the model's own output
        # (and no user hooks: the structured path computes blocks from cached activations, not through them)
        self.is_wtc = (readout is None and hasattr(model, "logits_from") and hasattr(model, "embed_tokens")
                       and not has_hooks(model))
        self.suffix = None
        self.unembed_input = None
        with torch.no_grad():
            if self.is_wtc:
                self.suffix = Suffix(model, tokens)
                self.resid_pre = self.suffix.pre
                self.unembed_input = self.suffix.hidden
                logits = self.suffix.logits
            else:
                logits = self._generic_clean()
                again = self.readout(self.model(self.tokens))
        if logits.ndim != 3 or logits.shape[:2] != tokens.shape[:2]:
            raise ScanError(f"readout must give logits (B, T, V) for tokens {tuple(tokens.shape)}, got {tuple(logits.shape)}")
        if not torch.isfinite(logits).all():
            raise ScanError("the clean logits hold NaN or inf; the model or readout is broken for these tokens")
        if not self.is_wtc and not (again.shape == logits.shape and torch.allclose(
                again, logits, rtol=1e-5, atol=1e-6 * max(float(logits.abs().max()), 1.0))):
            raise ScanError("the model gives different logits for the same tokens on a second run (dropout in train "
                            "mode, or another random op?): every KL would be noise; call model.eval() or make the "
                            "forward deterministic")
        self.V = logits.shape[-1]
        self.logits = logits.detach()
        # (N, V) float64 whatever the model's precision (see wtc.scan.kl.kl_rows)
        self.logp = (self.suffix.logp if self.suffix is not None
                     else torch.log_softmax(logits.double(), -1).reshape(-1, self.V))

    def structured(self, name: str) -> bool:
        """Whether wtc.scan.suffix computes this parameter's ablations from cached activations."""
        return self.suffix is not None and Suffix.handles(name)

    def _generic_clean(self):
        """Clean logits; also captures the input of a final linear map whose output is the logits."""
        ins, outs = {}, {}
        names = [name for name, mod in self.model.named_modules()
                 if isinstance(mod, nn.Linear) or (hasattr(mod, "W_U") and isinstance(getattr(mod, "W_U"), torch.Tensor))]

        def keep(into, name):
            return lambda value, module: into.__setitem__(name, value.detach())

        with (hook_modules(self.model, [(n, keep(ins, n)) for n in names], on="input"),
              hook_modules(self.model, [(n, keep(outs, n)) for n in names])):
            logits = self.readout(self.model(self.tokens))
        self.final_linear = {n: ins[n] for n, o in outs.items() if o.shape == logits.shape and torch.equal(o, logits)}
        return logits

    def shared(self, param: torch.Tensor) -> bool:
        """Whether this parameter is registered under more than one name (tied weights)."""
        if not hasattr(self, "_shared"):
            seen: dict[int, int] = {}
            for _, p in self.model.named_parameters(remove_duplicate=False):
                seen[id(p)] = seen.get(id(p), 0) + 1
            self._shared = {k for k, n in seen.items() if n > 1}
        return id(param) in self._shared

    # ----------------------------------------------------------------- closed form
    def unembed_weight(self, name: str, param: torch.Tensor):
        """(h (N, D), W (V, D), transposed?) when zeroing this parameter moves single logits."""
        module_name, _, leaf = name.rpartition(".")
        if self.is_wtc:
            if name == "unembed.W_U":
                return self.unembed_input.reshape(-1, param.shape[0]), param.detach().T, True
            return None
        h = getattr(self, "final_linear", {}).get(module_name)
        if h is None or self.shared(param):       # a tied weight (e.g. the embedding) moves more than the logits
            return None
        mod = self.model.get_submodule(module_name)
        if isinstance(mod, nn.Linear) and leaf == "weight":
            return h.reshape(-1, param.shape[1]), param.detach(), False
        if leaf == "W_U":
            return h.reshape(-1, param.shape[0]), param.detach().T, True
        return None

    # ----------------------------------------------------------------- batched exact ablation
    def ablated_logits(self, name: str, param: torch.Tensor, flat_idx: torch.Tensor):
        """(A, N, V) logits with each weight zeroed in its own copy (biases, norm weights, other models)."""
        if not self.is_wtc:                          # any other nn.Module: the method wtc.scan.generic chooses
            return self.generic().ablated_logits(name, param, flat_idx).reshape(len(flat_idx), -1, self.V)
        A = len(flat_idx)
        copies = param.detach().reshape(1, -1).repeat(A, 1)
        copies[torch.arange(A, device=param.device), flat_idx.to(param.device)] = 0
        copies = copies.reshape(A, *param.shape)
        if self.is_wtc:
            m = re.match(r"blocks\.(\d+)\.(.*)", name)
            if m:
                layer, local = int(m.group(1)), m.group(2)
                block = self.model.blocks[layer]
                resid = self.resid_pre[layer]

                def run(p):
                    out = functional_call(block, {local: p}, (resid,))
                    return self.model.logits_from(out, layer + 1)
            else:
                def run(p):
                    return functional_call(self.model, {name: p}, (self.tokens,))
        with torch.no_grad():
            logits = vmap(run)(copies)
        return logits.reshape(A, -1, self.V)

    def generic(self) -> Generic:
        """The generic path's method chooser (wtc.scan.generic), made on first use."""
        if getattr(self, "_generic", None) is None:
            budget = GPU_ACTIVATION_BUDGET if self.logits.is_cuda else ACTIVATION_BUDGET
            self._generic = Generic(self.model, self.tokens, self.readout, self.logits, budget)
        return self._generic


def _batch_size(ev: _Evaluator, batch: int | None) -> int:
    if batch is not None:
        if not isinstance(batch, int) or batch < 1:
            raise ScanError(f"batch must be a positive int, got {batch!r}")
        return batch
    N = ev.logp.shape[0]
    cfg = getattr(ev.model, "cfg", None)
    widest = ev.V * 3
    if cfg is not None and hasattr(cfg, "d_mlp"):
        T = ev.tokens.shape[1]
        widest = max(widest, (cfg.d_mlp or 0) * 2, cfg.n_heads * T * 2)
    budget = GPU_ACTIVATION_BUDGET if ev.logp.is_cuda else ACTIVATION_BUDGET
    return int(max(1, min(512, budget // (N * widest))))


def _dist():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def scan(model: nn.Module, tokens: torch.Tensor | ArrayLike, params: Params = None,
         readout: Callable[[Any], torch.Tensor] | None = None, batch: int | None = None,
         out: str | os.PathLike | None = None, mass: float = 0.9, keep_positions: bool | None = None,
         progress: bool = True, chunk: int = CHUNK, weights: dict[str, torch.Tensor] | None = None,
         positions: torch.Tensor | None = None, screen: int | None = None, screen_random: int | None = None,
         screen_samples: int = 4, screen_seed: int = 0) -> ScanResult:
    """Exact per-position KL(clean || weight zeroed) for every nonzero weight of `params`.

    model: a wtc Transformer, a TransformerLens HookedTransformer, or any nn.Module;
    tokens (B, T) int; params: names or fnmatch patterns (default: every parameter with >= 2 dims),
    in the model's own spelling or, for a wrapper such as HFModel, the wrapped model's (no `hf.`;
    wtc.scan.names); results keep the full names and look either up;
    readout: model output -> logits (B, T, V) (default: the output itself); batch: ablated copies
    per forward (default: sized to ~128 MiB of activations); out: directory for the resumable
    store (None: in memory); mass: share of KL the importance positions hold; keep_positions:
    store full per-position KL (default: when it fits in 1 GiB; otherwise recomputed on demand);
    weights: {name: bool mask shaped like the parameter} to scan only some weights exactly (e.g. the
    top of wtc.scan.fisher_estimate); unscanned weights report total KL 0 and no row in the store;
    positions: a bool mask (B, T): KL counted only there (e.g. the one position a task is read at),
    0 elsewhere; the ablations themselves still act everywhere, so effects that travel to the
    counted positions through attention are in.
    screen: K, to screen every weight first (wtc.scan.screening.screen: an estimate, screen_samples label
    draws, screen_seed) and scan exactly only the screen's top K plus screen_random weights drawn
    uniformly (default max(K, 200)), to show what the screen misses; result.screen holds the
    comparison (wtc.scan.screened.ScreenReport), out= also the estimate, screened.csv and a plot.
    With out= and progress, the store's estimated disk use is printed before the first weight, and
    a scan whose least disk use does not fit the free space there is refused (wtc.scan.store).
    """
    if screen is not None:
        from wtc.scan.screened import screened_scan      # the plain scan never loads the screen
        return screened_scan(scan, model, tokens, params=params, readout=readout, screen_k=screen,
                             screen_random=screen_random, screen_samples=screen_samples, seed=screen_seed, out=out,
                             progress=progress, weights=weights, positions=positions, batch=batch, mass=mass,
                             keep_positions=keep_positions, chunk=chunk)
    if not isinstance(mass, numbers.Real) or isinstance(mass, (bool, np.bool_)) or not 0 < mass <= 1:
        raise ScanError(f"mass must be a number in (0, 1], got {mass!r}")
    if isinstance(mass, (np.floating, np.integer)):
        mass = float(mass)               # a numpy number as a float (the store records it as JSON)
    if not isinstance(model, nn.Module):
        raise ScanError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if keep_positions is not None and not isinstance(keep_positions, bool):
        raise ScanError(f"keep_positions must be None, True or False, got {keep_positions!r}")
    if not isinstance(progress, bool):
        raise ScanError(f"progress must be True or False, got {progress!r}")
    if out is not None:
        if not isinstance(out, (str, os.PathLike)) or not str(out):
            raise ScanError(f"out must be None or a directory path, got {out!r}")
        if Path(out).exists() and not Path(out).is_dir():
            raise ScanError(f"out {str(out)!r} is a file; the scan store is a directory (out/scan.sqlite)")
    chunk = positive_int(chunk, "chunk")
    if batch is not None:
        batch = positive_int(batch, "batch")
    if not (readout is None or callable(readout)):
        raise ScanError(f"readout must be a callable (model output -> logits) or None, got {type(readout).__name__}")
    chosen = _select_params(model, params)
    tokens = as_tokens(tokens, model).to(next(iter(chosen.values())).device)   # ids from numpy for a GPU model
    prefix = wrapper_prefix(n for n, _ in model.named_parameters())
    aliases = bridge_names.scanned_aliases(model, chosen)     # other names of the chosen parameters
    masks = _check_masks(weights, chosen, prefix, aliases)
    if positions is not None:
        positions = torch.as_tensor(positions)
        if positions.dtype != torch.bool or positions.shape != tokens.shape:
            raise ScanError(f"positions must be a bool mask shaped like the tokens {tuple(tokens.shape)}, "
                             f"got {positions.dtype} {tuple(positions.shape)}")
        if not bool(positions.any()):
            raise ScanError("positions selects no position (the mask is all False): every KL would be 0; "
                            "mark at least one position to count")
    was_training = model.training
    model.eval()
    try:
        twin = _wtc_twin(model, tokens, chosen) if readout is None else None
        if twin is not None:                     # same names, same function: scan the twin's parameters
            named = dict(twin.named_parameters())
            chosen = {n: named[n] for n in chosen}
        ev = _Evaluator(twin if twin is not None else model, tokens, readout)
        ev.counted = None if positions is None else positions.flatten().to(ev.logp.device)
        return _scan(model, tokens, chosen, masks, ev, batch, out, mass, keep_positions, progress, chunk)
    finally:
        model.train(was_training)


def _wtc_twin(model: nn.Module, tokens: torch.Tensor, chosen: dict) -> nn.Module | None:
    """For a TransformerLens HookedTransformer that wtc.models.Transformer can express (standard
    positions, LN / RMS / no norm, ReLU / GELU): the wtc Transformer with its weights, so the scan
    takes the structured path (the parameter names are the same). Used only when its logits match
    the HookedTransformer's on these tokens and no hooks are registered; otherwise None (the
    generic path)."""
    if type(model).__name__ != "HookedTransformer" or has_hooks(model):
        return None
    try:
        from wtc.models.tl import from_hooked_transformer
        twin = from_hooked_transformer(model).to(next(model.parameters()).device)
    except (ValueError, KeyError, AttributeError, TypeError, RuntimeError):
        return None
    named = dict(twin.named_parameters())
    if any(n not in named or named[n].shape != p.shape for n, p in chosen.items()):
        return None
    with torch.no_grad():
        ours, theirs = twin(tokens), model(tokens)
    tol = 1e-10 if theirs.dtype == torch.float64 else 1e-4      # rounding of the two op orders, no more
    if ours.shape != theirs.shape or not bool(((ours - theirs).abs() <= tol * theirs.abs().amax().clamp_min(1)).all()):
        return None
    return twin


def _check_masks(weights, chosen, prefix: str = "", aliases: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Flat bool masks of the weights to scan (nonzero and selected); a key of `weights` may be
    written in the wrapped model's own spelling or as another name of the parameter (wtc.scan.names)."""
    if weights is not None and not isinstance(weights, dict):
        raise ScanError(f"weights must be None or a dict {{parameter name: bool mask}}, got {type(weights).__name__}")
    weights = {resolve(k, list(chosen), prefix, what="weights= key", aliases=aliases) if isinstance(k, str) else k: v
               for k, v in (weights or {}).items()}
    unknown = set(weights) - set(chosen)
    if unknown:
        raise UnknownName(f"weights= names parameters that are not scanned: {sorted(unknown, key=repr)}")
    masks = {}                                   # on the CPU: chunk bookkeeping, whatever the model's device
    for name, p in chosen.items():
        mask = p.detach().flatten().cpu() != 0
        if name in weights:
            m = torch.as_tensor(weights[name]).cpu()
            if m.shape != p.shape or m.dtype != torch.bool:
                raise ScanError(f"weights[{name!r}] must be a bool mask of shape {tuple(p.shape)}, "
                                 f"got {m.dtype} {tuple(m.shape)}")
            mask &= m.flatten()
        masks[name] = mask
    return masks


def _scan(model, tokens, chosen, masks, ev, batch, out, mass, keep_positions, progress, chunk) -> ScanResult:
    rank, world = _dist()
    N = ev.logp.shape[0]
    nonzero = {n: int(m.sum()) for n, m in masks.items()}
    if keep_positions is None:
        keep_positions = sum(nonzero.values()) * N * 4 <= KEEP_POSITIONS_BYTES
    meta = {**_fingerprint(model, tokens), "architecture": architecture(model), "hooks": hooks_identity(model),
            "readout": readout_identity(ev.readout_given), "params": sorted(chosen), "mass": mass, "keep_positions": keep_positions,
            "positions_sha256": None if ev.counted is None else hashlib.sha256(ev.counted.cpu().numpy().tobytes()).hexdigest(),
            "weights_sha256": hashlib.sha256(b"".join(
                m.numpy().tobytes() for _, m in sorted(masks.items()))).hexdigest()}
    if world > 1:        # ranks share chunks round-robin: the chunk size is part of a distributed scan's identity
        meta["chunk"] = chunk
    directory = Path(out) if out is not None else None
    path = ":memory:" if directory is None else directory / (f"scan.rank{rank}.sqlite" if world > 1 else "scan.sqlite")
    store = ScanStore(path)
    store.bind(meta)
    store.verify()                       # what a resume keeps must be what was written
    A = _batch_size(ev, batch)
    t0 = time.perf_counter()
    todo = []       # (param, chunk start, chunk stop)
    for name, p in chosen.items():
        if world == 1:      # what no finished chunk covers, whatever chunk size wrote them
            todo += [(name, start, stop) for start, stop in store.todo_ranges(name, p.numel(), chunk)]
            continue
        done = store.done_chunks(name)
        for c, start in enumerate(range(0, p.numel(), chunk)):
            if c % world == rank and start not in done:
                todo.append((name, start, min(start + chunk, p.numel())))
    total_work = sum(int(masks[n][s:e].sum()) for n, s, e in todo)
    if directory is not None and total_work:
        _announce_disk(directory, todo, masks, N, keep_positions, progress)
    bar = tqdm(total=total_work, disable=not progress, unit="w", desc=f"scan rank {rank}" if world > 1 else "scan")
    scanned = 0
    for name, start, stop in todo:
        p = chosen[name]
        idx = masks[name][start:stop].nonzero().flatten() + start
        totals, positions, full = _chunk(ev, name, p, idx, A, mass, keep_positions, bar.update)
        store.write_chunk(name, start, stop, idx.numpy(), totals, positions, full)
        scanned += len(idx)
    bar.close()
    if world > 1:
        torch.distributed.barrier()
        if rank == 0:
            merged = ScanStore(directory / "scan.sqlite") if directory else None
            if merged is None:
                raise ScanError("a distributed scan needs out= (a directory shared by the ranks)")
            merged.bind(meta)
            for r in range(world):
                shard = ScanStore(directory / f"scan.rank{r}.sqlite")
                merged.merge_from(shard)
                shard.close()
            store.close()
            store = merged
        torch.distributed.barrier()
        if rank != 0:
            store.close()
            store = ScanStore(directory / "scan.sqlite")
    seconds = time.perf_counter() - t0
    return ScanResult(store, {n: tuple(p.shape) for n, p in chosen.items()}, N, seconds, scanned,
                      recompute=lambda name, index: _position_kl_one(ev, name, chosen[name], index),
                      prefix=wrapper_prefix(n for n, _ in model.named_parameters()),
                      aliases=bridge_names.scanned_aliases(model, chosen))


def _announce_disk(directory: Path, todo, masks, N: int, keep_positions: bool, progress: bool) -> None:
    """Before the first weight: what the rows still to write will take on disk (refused when even
    the least of it does not fit; said when the most might not)."""
    rows: dict[str, int] = {}
    for name, start, stop in todo:
        rows[name] = rows.get(name, 0) + int(masks[name][start:stop].sum())
    estimate = disk_estimate(rows, N, keep_positions)
    free = check_space(directory, estimate)
    if progress:                           # a progress line: the "wtc" logger (stderr under the command)
        enable()
        log.info(f"estimated disk use: {estimate.describe()} for {estimate.weights} weights in {directory} "
                 f"({'with' if keep_positions else 'without'} per-position KL; {free / 1e9:.1f} GB free)")
    if estimate.high > free:
        log.warning(f"the store may outgrow the {free / 1e9:.2f} GB free in {directory} if many weights spread "
                    "their KL over many positions")


def _chunk(ev, name, p, idx, A, mass, keep_positions, progress=lambda n: None):
    """Totals (float64), importance positions and (optionally) full per-position KL for weights idx;
    progress(n) after every n weights done (a chunk of slow weights can take minutes)."""
    if len(idx) == 0:
        return np.zeros(0), [], (np.zeros((0, ev.logp.shape[0]), np.float32) if keep_positions else None)
    closed = ev.unembed_weight(name, p)
    if closed is not None:
        totals, per = _closed_form(ev, closed, idx)
        progress(len(idx))
        if ev.counted is not None:
            per = per * ev.counted
            totals = per.double().sum(-1)
    else:
        per64 = torch.cat([_progress(_exact_rows(ev, name, p, part), progress) for part in _batches(ev, name, p, idx, A)])
        if ev.counted is not None:
            per64 = per64 * ev.counted
        totals, per = per64.sum(-1), per64.float()
    totals, per = totals.cpu(), per.float().cpu()
    positions = importance_positions(per, mass)
    return totals.numpy(), positions, (per.numpy() if keep_positions else None)


def _progress(rows: torch.Tensor, progress) -> torch.Tensor:
    progress(len(rows))
    return rows


def _batches(ev, name, p, idx, A):
    if ev.structured(name):
        key = ev.suffix.batch_key(name, p, idx)
        if key is not None:                      # embedding rows: one row per batch
            for r in torch.unique(key):
                yield from idx[key == r].split(A)
            return
        if ev.suffix.cheap(name):                # rank-1 KL: no (A, N, V) tensor, so large batches
            yield from idx.split(256)
            return
    yield from idx.split(A)


def _exact_rows(ev, name, p, idx) -> torch.Tensor:
    if ev.structured(name):
        return ev.suffix.kl(name, p, idx)
    return kl_rows(ev.logp, ev.ablated_logits(name, p, idx))


def _closed_form(ev, closed, idx):
    """Closed-form totals (len(idx),) float64 and per-position KL (len(idx), N)."""
    h, W, transposed = closed                    # h (N, D), W (V, D)
    idx = idx.to(h.device)
    if transposed:                               # param (D, V): flat = j * V + v
        j, v = idx // W.shape[0], idx % W.shape[0]
    else:                                        # param (V, D): flat = v * D + j
        v, j = idx // W.shape[1], idx % W.shape[1]
    # the closed form has no cancellation: log-probs in the model's precision serve (and keep it native)
    return kl_unembed(ev.logp.to(h.dtype), h, W.to(h.dtype), v, j, per_position=True)


def _position_kl_one(ev, name, p, index) -> torch.Tensor:
    flat = int(np.ravel_multi_index(tuple(index), tuple(p.shape))) if not isinstance(index, int) else index
    if p.detach().flatten()[flat] == 0:
        return torch.zeros(ev.logp.shape[0], dtype=torch.float64)
    idx = torch.tensor([flat])                   # moved to the model's device where it is used
    closed = ev.unembed_weight(name, p)
    row = _closed_form(ev, closed, idx)[1][0].double() if closed is not None else _exact_rows(ev, name, p, idx)[0]
    return (row if ev.counted is None else row * ev.counted).cpu()
