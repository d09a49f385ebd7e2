"""What `wtc scan` reads: the model (a wtc checkpoint, a local Hugging Face model directory, or a
TransformerLens TransformerBridge over one) and the tokens (ids in .npy / .pt, or a text file read
through the model's own tokenizer), and where it runs (start(): the device; under torchrun, the
process group, so the scan and the screen share their work across the ranks).

A text file is tokenised whole by the model's tokenizer and cut into consecutive windows of
min(context, TEXT_WINDOW) tokens (the tail that fills no window is dropped), so the scan reads
the text the model was trained to read, in its own ids.
"""
from __future__ import annotations

from pathlib import Path

import os

import numpy as np
import torch
from torch import nn

from wtc.errors import ScanError
from wtc.scan.inputs import as_tokens, context_size

TEXT_WINDOW = 64           # tokens per window cut from a text file (the explain command's ceiling too)
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".text")


def is_hf_directory(path) -> bool:
    return (Path(path) / "config.json").is_file()


def start(device: str | None = None) -> str:
    """The device this process scans on (None: cpu). Launched by torchrun (WORLD_SIZE > 1 in the
    environment), the process group is initialised first (nccl on CUDA, else gloo) and each rank
    takes cuda:LOCAL_RANK when the device is cuda."""
    device = device or "cpu"
    if not (device == "cpu" or device.startswith("cuda")):
        raise ScanError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ScanError(f"--device {device}: torch sees no CUDA GPU here")
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1 and torch.distributed.is_available() and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        if device == "cuda":
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def rank0() -> bool:
    """Whether this process writes the command's files and prints its results (the only one, or rank 0)."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or torch.distributed.get_rank() == 0


def load_model(path, bridge: bool = False, device: str = "cpu") -> nn.Module:
    """A wtc checkpoint directory (wtc.models.io.load), or a Hugging Face model directory
    (wtc.models.hf.load; bridge=True: wtc.models.tl.load_bridge, for TransformerLens names), on `device`."""
    if bridge:
        if not is_hf_directory(path):
            raise ScanError(f"{path}: --bridge reads a local Hugging Face model directory (config.json and weights); "
                            "this is not one")
        from wtc.models.tl import load_bridge
        try:
            return load_bridge(path, device=device)
        except ImportError as exc:
            raise ScanError(f"{exc} (needed by --bridge)") from None
    if is_hf_directory(path):
        from wtc.models import hf
        return hf.load(path).to(device)
    from wtc.models.io import load
    return load(path).to(device)


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


def interrupted(out, screened: bool) -> str:
    """What an interrupted `wtc scan` kept in `out`, and how to go on."""
    import sqlite3

    db = Path(out) / "scan.sqlite"
    try:
        done = sqlite3.connect(str(db)).execute("SELECT COUNT(*) FROM weights").fetchone()[0] if db.exists() else 0
    except sqlite3.Error:                  # interrupted before the store had its tables
        done = 0
    kept = f" (the screen's finished blocks in {Path(out) / 'screen'})" if screened else ""
    return f"interrupted: {done} weights are safely in {db}{kept}; run the same command again to resume"


__all__ = ["start", "interrupted", "rank0", "load_model", "load_tokens", "is_hf_directory", "TEXT_WINDOW"]
