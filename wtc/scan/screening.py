"""screen(): an *estimate* of every weight's total KL(clean || zeroed), for all weights at once.

The exact scan (wtc.scan.engine) costs one suffix pass per weight; the screen costs `samples`
vmap'd backward passes over the tokens for the whole model: 1/2 w_i^2 F_ii with the Fisher diagonal
estimated from per-sequence gradients under labels drawn from the model (wtc.scan.screen_estimators
has the math and why it is unbiased). It ranks weights so exact ablations can be spent on the
candidates (scan(..., screen=K)); its numbers are estimates, never stored as, or mixed with, exact
KLs. Where the quadratic model of zeroing fails (a large weight whose removal saturates a
softmax, or turns a unit on that was off) the estimate is off too; bench/RESULTS.md ("Session 22")
measures by how much.

Resumable and sharded like the scan: the sequences are cut into blocks (the unit of work); the
labels of block b, draw d depend on (seed, b, d) only. With out=, each rank keeps its float64 sums
and finished blocks in out/state[.rank<r>].pt (written atomically every CHECKPOINT_SECONDS and at
the end) under an identity (out/meta.json: model, tokens, parameters, readout, samples, seed,
block, ranks) that a resume must match. With torch.distributed initialised, blocks are shared
round-robin; rank 0 adds the ranks' sums (in rank order) and every rank returns the same estimate.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from wtc import arguments
from wtc.errors import ScanError
from wtc.scan.inputs import architecture, default_readout, as_tokens, hooks_identity, model_sha256, readout_identity
from wtc.scan.names import Params, select
from wtc.scan.screen_estimators import (SwapError, draw_labels, label_generator, label_probs,
                                        squared_sequence_gradients)

ESTIMATOR = "fisher-sampled-labels/1"   # 1/2 w^2 F_ii, F from per-sequence gradients under y ~ p
MAX_SAMPLES = 10_000
GRADIENT_BUDGET = 2**28                 # bytes of per-sequence gradients held at once (sets the block)
CHECKPOINT_SECONDS = 30.0


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def block_size(chosen: dict[str, torch.Tensor], sequences: int) -> int:
    """Sequences per vmap'd backward: their per-sequence gradients (float32) fit GRADIENT_BUDGET."""
    numel = sum(p.numel() for p in chosen.values())
    return int(max(1, min(sequences, GRADIENT_BUDGET // max(1, 4 * numel))))


def screen(model: nn.Module, tokens, params: Params = None, readout: Callable[[Any], torch.Tensor] | None = None,
           *, samples: int = 4, seed: int = 0, block: int | None = None, positions=None,
           out: str | os.PathLike | None = None, progress: bool = True) -> dict[str, torch.Tensor]:
    """{name: float64 tensor shaped like the parameter}: the estimated total KL (summed over the
    counted positions) of zeroing each weight, 1/2 w^2 F_ii (0 for weights already zero).

    params / readout / positions as for wtc.scan.scan (default: every parameter with >= 2 dims);
    samples: label draws per sequence (the estimate's noise falls as 1/sqrt(samples x sequences));
    seed: of the label draws; block: sequences per vmap'd backward (default: by memory, part of a
    resumable screen's identity); out: directory for the resumable state (None: in memory; needed
    under torch.distributed)."""
    if not isinstance(model, nn.Module):
        raise ScanError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    samples = arguments.positive_int(samples, "samples", ScanError, upper=MAX_SAMPLES)
    seed = arguments.seed(seed, error=ScanError)
    if not (readout is None or callable(readout)):
        raise ScanError(f"readout must be a callable (model output -> logits) or None, got {type(readout).__name__}")
    if not isinstance(progress, bool):
        raise ScanError(f"progress must be True or False, got {progress!r}")
    if out is not None and (not isinstance(out, (str, os.PathLike)) or not str(out) or Path(out).is_file()):
        raise ScanError(f"out must be None or a directory path, got {out!r}")
    tokens = as_tokens(tokens, model)
    chosen = select(model, params)
    device = next(iter(chosen.values())).device
    tokens = tokens.to(device)
    counted = _counted(positions, tokens)
    block = block_size(chosen, tokens.shape[0]) if block is None else arguments.positive_int(block, "block", ScanError)
    rank, world = _dist()
    if world > 1 and out is None:
        raise ScanError("a distributed screen needs out= (a directory shared by the ranks)")
    user = readout
    read = default_readout if user is None else (lambda o: arguments.float_readout(user, o, ScanError))
    meta = {"estimator": ESTIMATOR, "model_sha256": model_sha256(model), "architecture": architecture(model),
            "hooks": hooks_identity(model), "readout": readout_identity(user), "params": sorted(chosen),
            "tokens_sha256": hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest(),
            "tokens_shape": list(tokens.shape), "samples": samples, "seed": seed, "block": block, "world": world,
            "positions_sha256": None if positions is None else hashlib.sha256(counted.cpu().numpy().tobytes()).hexdigest()}
    state = _State(Path(out) if out is not None else None, rank, world, meta, chosen)
    modes = [(m, m.training) for m in model.modules()]     # as scan: dropout would be noise in the estimate
    model.eval()
    try:
        _run(model, tokens, counted, chosen, read, samples, seed, block, state, progress)
    finally:
        for m, training in modes:
            m.training = training
    sums = state.merged()
    return {n: 0.5 * chosen[n].detach().double() ** 2 * sums[n].to(chosen[n].device) / samples for n in chosen}


def _counted(positions, tokens: torch.Tensor) -> torch.Tensor:
    if positions is None:
        return torch.ones(tokens.shape, dtype=torch.float32, device=tokens.device)
    positions = torch.as_tensor(positions)
    if positions.dtype != torch.bool or positions.shape != tokens.shape:
        raise ScanError(f"positions must be a bool mask shaped like the tokens {tuple(tokens.shape)}, "
                        f"got {positions.dtype} {tuple(positions.shape)}")
    if not bool(positions.any()):
        raise ScanError("positions selects no position (the mask is all False): every estimate would be 0")
    return positions.to(tokens.device, torch.float32)


def _run(model, tokens, counted, chosen, read, samples, seed, block, state, progress) -> None:
    starts = list(range(0, tokens.shape[0], block))
    mine = [b for b in range(len(starts)) if b % state.world == state.rank and b not in state.done]
    bar = tqdm(total=sum(min(block, tokens.shape[0] - starts[b]) for b in mine) * samples, disable=not progress,
               unit="seq", desc=f"screen rank {state.rank}" if state.world > 1 else "screen")
    vectorised = True
    try:
        for b in mine:
            seqs, cnt = tokens[starts[b]:starts[b] + block], counted[starts[b]:starts[b] + block]
            with torch.no_grad():
                logits = read(model(seqs))
            if logits.ndim != 3 or logits.shape[:2] != seqs.shape:
                raise ScanError(f"readout must give logits (B, T, V) for tokens {tuple(seqs.shape)}, got {tuple(logits.shape)}")
            if not torch.isfinite(logits).all():
                raise ScanError(f"the clean logits of sequences {starts[b]}.. hold NaN or inf; the model or readout is broken there")
            # every draw of the block in as few vmap'd backwards as the gradient budget allows; the
            # block's sums join the state only whole, so a state saved at any moment holds whole blocks
            per_call = max(1, block_size(chosen, samples * len(seqs)) // len(seqs))
            sums, probs = None, label_probs(logits)
            for first in range(0, samples, per_call):
                draws = range(first, min(samples, first + per_call))
                labels = torch.cat([draw_labels(probs, label_generator(state.meta["seed"], b, d), seqs.device)
                                    for d in draws])
                many, cnts = seqs.repeat(len(draws), 1), cnt.repeat(len(draws), 1)
                try:
                    sq = squared_sequence_gradients(model, chosen, many, labels, cnts, read, vectorised)
                except RuntimeError as exc:      # torch.func cannot vmap this model: one backward per sequence
                    if not vectorised or not (isinstance(exc, SwapError) or "vmap" in str(exc)):
                        raise
                    vectorised = False
                    sq = squared_sequence_gradients(model, chosen, many, labels, cnts, read, vectorised)
                sums = sq if sums is None else {n: sums[n] + sq[n] for n in sums}
                bar.update(len(many))
            state.add(sums)
            state.finish(b)
    except KeyboardInterrupt:
        state.save()             # the blocks finished so far are kept for a rerun
        raise
    finally:
        bar.close()
    state.save()


class _State:
    """One rank's float64 sums of squared gradients and finished blocks, on disk when out= is given."""

    def __init__(self, directory: Path | None, rank: int, world: int, meta: dict, chosen: dict):
        self.directory, self.rank, self.world, self.meta = directory, rank, world, meta
        self.sums = {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in chosen.items()}
        self.done: set[int] = set()
        self.saved_at = time.monotonic()
        if directory is None:
            return
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ScanError(f"{directory}: cannot create the screen's directory ({exc.strerror or exc})") from None
        meta_path = directory / "meta.json"
        if rank == 0 and not meta_path.exists():
            _atomic_write(meta_path, json.dumps(meta, sort_keys=True, indent=1).encode())
        if world > 1:
            torch.distributed.barrier()      # every rank checks the identity rank 0 wrote (or found)
        old = json.loads(meta_path.read_text())
        for key, value in json.loads(json.dumps(meta)).items():
            if old.get(key) != value:
                raise ScanError(f"{directory}: this screen state was written for a different {key} "
                                f"({json.dumps(old.get(key))[:80]} != {json.dumps(value)[:80]}); use a new output directory")
        path = self.path(rank)
        if path.exists():
            kept = torch.load(path, weights_only=True)
            if set(kept["sums"]) != set(self.sums):
                raise ScanError(f"{path}: its parameters differ from meta.json's (the state was edited); use a new output directory")
            self.sums, self.done = kept["sums"], set(kept["done"])

    def path(self, rank: int) -> Path:
        return self.directory / (f"state.rank{rank}.pt" if self.world > 1 else "state.pt")

    def add(self, sq: dict[str, torch.Tensor]) -> None:
        for n, v in sq.items():
            self.sums[n] += v.detach().cpu()

    def finish(self, block: int) -> None:
        self.done.add(block)
        if time.monotonic() - self.saved_at >= CHECKPOINT_SECONDS:
            self.save()

    def save(self) -> None:
        if self.directory is None:
            return
        tmp = self.path(self.rank).with_suffix(".tmp")
        torch.save({"sums": self.sums, "done": sorted(self.done)}, tmp)
        os.replace(tmp, self.path(self.rank))
        self.saved_at = time.monotonic()

    def merged(self) -> dict[str, torch.Tensor]:
        """The sums over every rank's blocks (each rank returns the same numbers)."""
        if self.world == 1:
            return self.sums
        torch.distributed.barrier()
        total = self.directory / "sums.pt"
        if self.rank == 0:
            sums = {n: torch.zeros_like(v) for n, v in self.sums.items()}
            for r in range(self.world):
                for n, v in torch.load(self.path(r), weights_only=True)["sums"].items():
                    sums[n] += v
            tmp = total.with_suffix(".tmp")
            torch.save(sums, tmp)
            os.replace(tmp, total)
        torch.distributed.barrier()
        return torch.load(total, weights_only=True)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def flat_ranking(estimate: dict[str, torch.Tensor]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(names in order, offsets of each name in the flat vector, the flat float64 estimates)."""
    names = list(estimate)
    flat = [estimate[n].detach().double().cpu().flatten().numpy() for n in names]
    offsets = np.cumsum([0] + [len(f) for f in flat])
    return names, offsets, (np.concatenate(flat) if flat else np.zeros(0))
