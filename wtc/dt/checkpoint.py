"""Checkpoints: safetensors for tensors, JSON for everything else. Nothing is unpickled.

A model checkpoint is a directory with model.safetensors and model.json (config, dimensions,
format version). The DT's training-state checkpoints use the same two-file layout (wtc.checkpoint_io).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from wtc.checkpoint_io import read, write_atomic
from wtc.dt.config import DTConfig
from wtc.errors import CheckpointError

if TYPE_CHECKING:                      # annotations only: load() imports the model class when it runs
    from wtc.dt.model import DiscreteTransformer

FORMAT = "wtc.dt/1"


def model_meta(model) -> dict:
    return {"format": FORMAT, "config": model.config.to_dict(), "seq_len": model.seq_len,
            "n_inputs": model.n_inputs, "n_outputs": model.n_outputs, "replicas": model.R}


def build_model(meta: dict, tensors: dict[str, torch.Tensor], prefix: str = ""):
    """Rebuild a DiscreteTransformer from model_meta() output and its state tensors."""
    from wtc.dt.model import DiscreteTransformer

    if meta.get("format") != FORMAT:
        raise CheckpointError(f"unsupported checkpoint format {meta.get('format')!r} (expected {FORMAT!r})")
    for key in ("seq_len", "n_inputs", "n_outputs", "replicas"):
        # checked here, not by torch: replicas=-3 made a negative-size tensor (a RuntimeError), 0 the config's count
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"checkpoint metadata (model.json): {key} must be a positive integer, got {value!r}")
    if not isinstance(meta.get("config"), dict):
        raise CheckpointError(f"checkpoint metadata (model.json): config must be a JSON object, got {meta.get('config')!r}")
    try:
        config = DTConfig.from_dict(meta["config"])
        model = DiscreteTransformer(config, seq_len=meta["seq_len"], n_inputs=meta["n_inputs"],
                                    n_outputs=meta["n_outputs"], replicas=meta["replicas"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:      # ConfigError is a ValueError
        raise CheckpointError(f"checkpoint metadata (model.json) does not describe a model: "
                              f"{' '.join(str(exc).split())}") from exc
    state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    for key, value in model.state_dict().items():    # written before SubMLPs' steps and output unit:
        if key.endswith((".mlp.whole", ".mlp.level_origin", ".mlp.level_size")) and key not in state:
            state[key] = value                                         # no step set to levels
        if key.endswith(".mlp.output_unit") and key not in state:     # no output read periodically
            state[key] = torch.zeros_like(value)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint tensors do not match the model: {exc}") from exc
    _check_structure(model)
    if bool(model.frozen):
        for sel in model.selectors():
            sel.logits.requires_grad_(False)
    return model


def _check_structure(model) -> None:
    """The discrete structure must be one the model can run: every frozen choice an allowed
    variable of its slot (a corrupt index would crash later in predict, or read another variable).
    (A training population may hold a diverged replica, so finiteness is checked in load() only.)"""
    for sel in model.selectors():
        idx, mask = sel.frozen_index, sel.mask                        # (R, S), (S, V)
        frozen = idx >= 0
        if bool((idx < -1).any()) or bool((idx >= mask.shape[1]).any()):
            raise CheckpointError(f"frozen selection index out of range [0, {mask.shape[1]}) in "
                                  f"{sel.slot_names[0].rsplit('.', 1)[0]}: {idx.tolist()}")
        if bool(model.frozen) and not bool(frozen.all()):
            raise CheckpointError("checkpoint says the model is frozen, but some selections are not")
        slots = torch.arange(idx.shape[1]).expand_as(idx)
        allowed = mask[slots[frozen], idx[frozen]]
        if not bool(allowed.all()):
            raise CheckpointError("a frozen selection reads a variable its slot may not read (corrupt checkpoint)")


def save(model, directory, extra: dict | None = None) -> Path:
    """Save a model to directory/model.safetensors + directory/model.json."""
    from wtc.dt.model import DiscreteTransformer

    if not isinstance(model, DiscreteTransformer):
        raise CheckpointError(f"save writes a DiscreteTransformer, got {type(model).__name__}")
    if not isinstance(directory, (str, Path)) or not str(directory):
        raise CheckpointError(f"a checkpoint is a directory path, got {type(directory).__name__} {directory!r}")
    if extra is not None and not isinstance(extra, dict):
        raise CheckpointError(f"extra must be None or a dict (written to model.json), got {type(extra).__name__}")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"{directory} is a file; a checkpoint is a directory (model.safetensors + model.json)")
    meta = model_meta(model)
    if extra:
        meta["extra"] = extra
    write_atomic(directory / "model", model.state_dict(), meta)
    return directory


def load(directory: str | Path) -> DiscreteTransformer:
    """Load a model saved by save() (weights_only by construction: safetensors + JSON). What its
    training recorded (`extra`: the task's name and fingerprint, the seed, ...) is its train_info
    again, so wtc.extract refuses a task other than the one it was trained on."""
    if not isinstance(directory, (str, Path)):
        raise CheckpointError(f"a checkpoint is a directory path, got {type(directory).__name__} {directory!r}")
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint directory at {directory}")
    tensors, meta = read(directory / "model")
    model = build_model(meta, tensors)
    bad = [k for k, v in model.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"{directory}: the model's tensors hold NaN/inf: {bad[:5]}")
    model.extra = meta.get("extra", {})
    # what training recorded (task name and fingerprint, seed, snaps): extract() checks the task against it
    model.train_info = dict(model.extra) if isinstance(model.extra, dict) else {}
    return model.eval()
