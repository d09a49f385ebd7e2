"""Save and load token transformers (safetensors + JSON config) and token files (.npy / .pt)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from wtc.checkpoint_io import check_digests, digests
from wtc.errors import CheckpointError, CheckpointNotFound, ScanError
from wtc.models.transformer import Transformer, TransformerConfig
from wtc.scan.inputs import as_tokens


def save(model: Transformer, directory, extra: dict | None = None) -> Path:
    """directory/model.safetensors + directory/config.json (TransformerConfig and `extra`)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(d / "model.safetensors"))
    meta = {"kind": "wtc.models.Transformer", "config": dataclasses.asdict(model.cfg), "extra": extra or {},
            "sha256": digests(state)}
    (d / "config.json").write_text(json.dumps(meta, indent=2))
    return d


def load(directory) -> Transformer:
    """The Transformer saved in `directory`; any way the files can be bad is a CheckpointError."""
    d = Path(directory)
    if not (d / "config.json").is_file() or not (d / "model.safetensors").is_file():
        raise CheckpointNotFound(f"{d}: not a wtc transformer checkpoint (needs config.json and model.safetensors)")
    try:
        meta = json.loads((d / "config.json").read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{d}/config.json is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("kind") != "wtc.models.Transformer":
        kind = meta.get("kind") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{d}/config.json: kind {kind!r} is not a wtc.models.Transformer")
    try:
        cfg = TransformerConfig(**meta["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{d}/config.json: bad TransformerConfig: {exc}") from None
    try:
        state = load_file(str(d / "model.safetensors"))
    except Exception as exc:   # safetensors raises its own SafetensorError for truncated / corrupt files
        raise CheckpointError(f"{d}/model.safetensors cannot be read: {exc}") from None
    check_digests(state, meta.get("sha256"), d / "model.safetensors")   # older checkpoints have none
    floats = [v.dtype for v in state.values() if v.is_floating_point()]
    if not floats:
        raise CheckpointError(f"{d}/model.safetensors holds no floating-point tensors")
    model = Transformer(cfg).to(floats[0])
    try:
        model.load_state_dict(state)             # strict: a mismatch names the missing/unexpected keys
    except RuntimeError as exc:
        raise CheckpointError(f"{d}: weights do not fit the config: {exc}") from None
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"{d}/model.safetensors: non-finite values in {bad[:5]}")
    return model.eval()


def load_tokens(path) -> torch.Tensor:
    """(B, T) int64 tokens from .npy or .pt (any integer dtype; ids checked to be >= 0 and to fit)."""
    path = Path(path)
    if path.suffix not in (".npy", ".pt", ".pth"):
        raise ScanError(f"{path}: token files are .npy or .pt, got {path.suffix!r}")
    if not path.is_file():
        raise ScanError(f"{path}: no such token file")
    try:
        tokens = np.load(path, allow_pickle=False) if path.suffix == ".npy" else torch.load(path, weights_only=True)
    except Exception as exc:
        raise ScanError(f"{path}: cannot read tokens: {exc}") from None
    return as_tokens(tokens, name=str(path))
