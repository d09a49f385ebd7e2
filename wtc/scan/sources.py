"""What `wtc scan` reads: the model (a wtc checkpoint, a local Hugging Face model directory, or a
TransformerLens TransformerBridge over one) and the tokens (ids in .npy / .pt, or a text file read
through the model's own tokenizer).

A text file is tokenised whole by the model's tokenizer and cut into consecutive windows of
min(context, TEXT_WINDOW) tokens (the tail that fills no window is dropped), so the scan reads
the text the model was trained to read, in its own ids.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from wtc.errors import ScanError
from wtc.scan.inputs import as_tokens, context_size

TEXT_WINDOW = 64           # tokens per window cut from a text file (the explain command's ceiling too)
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".text")


def is_hf_directory(path) -> bool:
    return (Path(path) / "config.json").is_file()


def load_model(path, bridge: bool = False) -> nn.Module:
    """A wtc checkpoint directory (wtc.models.io.load), or a Hugging Face model directory
    (wtc.models.hf.load; bridge=True: wtc.models.tl.load_bridge, for TransformerLens names)."""
    if bridge:
        if not is_hf_directory(path):
            raise ScanError(f"{path}: --bridge reads a local Hugging Face model directory (config.json and weights); "
                            "this is not one")
        from wtc.models.tl import load_bridge
        try:
            return load_bridge(path)
        except ImportError as exc:
            raise ScanError(f"{exc} (needed by --bridge)") from None
    if is_hf_directory(path):
        from wtc.models import hf
        return hf.load(path)
    from wtc.models.io import load
    return load(path)


def load_tokens(path, model: nn.Module) -> torch.Tensor:
    """(B, T) token ids for `model`: an .npy / .pt array of ids, or a text file (TEXT_SUFFIXES)
    tokenised by the model's tokenizer into consecutive windows (module docstring)."""
    p = Path(path)
    if p.suffix.lower() not in TEXT_SUFFIXES:
        from wtc.models.io import load_tokens as load_ids
        return as_tokens(load_ids(p), model, name=str(p))
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ScanError(f"{p}: a text file is read through the model's own tokenizer, and this model has none (a "
                        "Hugging Face model directory with its tokenizer files has one); pass token ids (.npy / .pt)")
    if not p.is_file():
        raise ScanError(f"{p}: no such text file")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ScanError(f"{p}: cannot read it ({exc.strerror or exc})") from None
    ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    window = min(context_size(model) or TEXT_WINDOW, TEXT_WINDOW)
    if len(ids) < window:
        raise ScanError(f"{p}: {len(ids)} tokens, fewer than one window of {window}; give a longer text")
    n = len(ids) // window
    return as_tokens(ids[:n * window].reshape(n, window), model, name=str(p))


__all__ = ["load_model", "load_tokens", "is_hf_directory", "TEXT_WINDOW"]
