"""Checkpoints: safetensors for tensors, JSON for everything else. Nothing is unpickled.

A model checkpoint is a directory with model.safetensors and model.json (config, dimensions,
format version). Training-state checkpoints (train.py) use the same two-file layout.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from wtc.dt.config import DTConfig
from wtc.errors import CheckpointError

FORMAT = "wtc.dt/1"


def write_atomic(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Write <path>.safetensors and <path>.json so that a crash never leaves a half-written pair."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_t, tmp_j = path.with_suffix(".safetensors.tmp"), path.with_suffix(".json.tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp_t))
    tmp_j.write_text(json.dumps(meta, indent=1))
    os.replace(tmp_t, path.with_suffix(".safetensors"))
    os.replace(tmp_j, path.with_suffix(".json"))


def read(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    path = Path(path)
    tfile, jfile = path.with_suffix(".safetensors"), path.with_suffix(".json")
    for f in (tfile, jfile):
        if not f.is_file():
            raise CheckpointError(f"checkpoint file missing: {f}")
    try:
        meta = json.loads(jfile.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"corrupt checkpoint metadata {jfile}: {exc}") from exc
    try:
        tensors = load_file(str(tfile))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"corrupt checkpoint tensors {tfile}: {exc}") from exc
    return tensors, meta


def model_meta(model) -> dict:
    return {"format": FORMAT, "config": model.config.to_dict(), "seq_len": model.seq_len,
            "n_inputs": model.n_inputs, "n_outputs": model.n_outputs, "replicas": model.R}


def build_model(meta: dict, tensors: dict[str, torch.Tensor], prefix: str = ""):
    """Rebuild a DiscreteTransformer from model_meta() output and its state tensors."""
    from wtc.dt.model import DiscreteTransformer

    if meta.get("format") != FORMAT:
        raise CheckpointError(f"unsupported checkpoint format {meta.get('format')!r} (expected {FORMAT!r})")
    try:
        config = DTConfig.from_dict(meta["config"])
        model = DiscreteTransformer(config, seq_len=meta["seq_len"], n_inputs=meta["n_inputs"],
                                    n_outputs=meta["n_outputs"], replicas=meta["replicas"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint metadata does not describe a model: {exc}") from exc
    state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint tensors do not match the model: {exc}") from exc
    if bool(model.frozen):
        for sel in model.selectors():
            sel.logits.requires_grad_(False)
    return model


def save(model, directory, extra: dict | None = None) -> Path:
    """Save a model to directory/model.safetensors + directory/model.json."""
    directory = Path(directory)
    meta = model_meta(model)
    if extra:
        meta["extra"] = extra
    write_atomic(directory / "model", model.state_dict(), meta)
    return directory


def load(directory):
    """Load a model saved by save() (weights_only by construction: safetensors + JSON)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint directory at {directory}")
    tensors, meta = read(directory / "model")
    model = build_model(meta, tensors)
    model.extra = meta.get("extra", {})
    return model.eval()
