"""Save and load token transformers (safetensors + JSON config) and token files (.npy / .pt)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from wtc.models.transformer import Transformer, TransformerConfig


def save(model: Transformer, directory, extra: dict | None = None) -> Path:
    """directory/model.safetensors + directory/config.json (TransformerConfig and `extra`)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    meta = {"kind": "wtc.models.Transformer", "config": dataclasses.asdict(model.cfg), "extra": extra or {}}
    (d / "config.json").write_text(json.dumps(meta, indent=2))
    return d


def load(directory) -> Transformer:
    d = Path(directory)
    if not (d / "config.json").exists() or not (d / "model.safetensors").exists():
        raise FileNotFoundError(f"{d}: not a wtc transformer checkpoint (needs config.json and model.safetensors)")
    meta = json.loads((d / "config.json").read_text())
    if meta.get("kind") != "wtc.models.Transformer":
        raise ValueError(f"{d}/config.json: kind {meta.get('kind')!r} is not a wtc.models.Transformer")
    cfg = TransformerConfig(**meta["config"])
    state = load_file(str(d / "model.safetensors"))
    dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    model = Transformer(cfg).to(dtype)
    model.load_state_dict(state)                 # strict: a mismatch names the missing/unexpected keys
    return model.eval()


def load_tokens(path) -> torch.Tensor:
    """(B, T) int64 tokens from .npy or .pt."""
    path = Path(path)
    if path.suffix == ".npy":
        tokens = torch.from_numpy(np.load(path))
    elif path.suffix in (".pt", ".pth"):
        tokens = torch.load(path, weights_only=True)
    else:
        raise ValueError(f"{path}: token files are .npy or .pt, got {path.suffix!r}")
    if tokens.ndim != 2 or tokens.dtype.is_floating_point:
        raise ValueError(f"{path}: tokens must be an integer array (B, T), got {tuple(tokens.shape)} {tokens.dtype}")
    return tokens.long()
