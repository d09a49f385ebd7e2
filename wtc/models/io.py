"""Save and load token transformers (a wtc.checkpoint_io pair: model.safetensors + model.json) and token files (.npy / .pt)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import torch

from wtc import checkpoint_io
from wtc.checkpoint_io import write_atomic
from wtc.errors import CheckpointError, CheckpointNotFound, ScanError
from wtc.models.transformer import Transformer, TransformerConfig
from wtc.scan.inputs import as_tokens


KIND = "wtc.models.Transformer"


def _directory(directory) -> Path:
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise CheckpointError(f"a checkpoint directory must be a non-empty str or Path, got {directory!r}")
    return Path(directory)


def save(model: Transformer, directory, extra: dict | None = None) -> Path:
    """directory/model.safetensors + directory/model.json (TransformerConfig and `extra`), written as
    one atomic pair with digests of every tensor and of the metadata (wtc.checkpoint_io)."""
    if not isinstance(model, Transformer):
        raise CheckpointError(f"save writes a wtc.models.Transformer, got {type(model).__name__}")
    if extra is not None and not isinstance(extra, dict):
        raise CheckpointError(f"extra must be None or a dict (written to model.json), got {type(extra).__name__}")
    d = _directory(directory)
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"{d} is a file; a checkpoint is a directory (model.safetensors + model.json)")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:                                      # load() refuses them: such a checkpoint could never be read back
        raise CheckpointError(f"the model holds non-finite weights (NaN or inf) in {bad[:5]}; a checkpoint of "
                              "it could not be loaded (did training diverge?)")
    write_atomic(d / "model", state, {"kind": KIND, "config": dataclasses.asdict(model.cfg), "extra": extra or {}})
    return d


def load(directory) -> Transformer:
    """The Transformer saved in `directory`; any way the files can be bad is a CheckpointError."""
    d = _directory(directory)
    if not checkpoint_io.exists(d / "model"):
        raise CheckpointNotFound(f"{d}: not a wtc transformer checkpoint (needs model.json and model.safetensors)")
    state, meta = checkpoint_io.read(d / "model")
    if meta.get("kind") != KIND:
        raise CheckpointError(f"{d}/model.json: kind {meta.get('kind')!r} is not a {KIND}")
    try:
        cfg = TransformerConfig(**meta["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{d}/model.json: bad TransformerConfig: {exc}") from None
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
    if not isinstance(path, (str, os.PathLike)):
        raise ScanError(f"a token file must be a str or Path, got {type(path).__name__}")
    path = Path(path)
    if path.suffix not in (".npy", ".pt", ".pth"):
        raise ScanError(f"{path}: token files are .npy or .pt, got {path.suffix!r}")
    if not path.is_file():
        raise ScanError(f"{path}: no such token file")
    tokens = _read_npy(path) if path.suffix == ".npy" else _read_pt(path)
    return as_tokens(tokens, name=str(path))


def _first_line(exc: Exception) -> str:
    return next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)


def _read_npy(path: Path):
    """An .npy array, never unpickled. numpy's own errors advise allow_pickle=True (unsafe), so what is
    wrong is said here: no NumPy header (a text file named .npy), or an object array (a pickle)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as exc:
        raise ScanError(f"{path}: cannot read tokens: {exc.strerror or exc}") from None
    if magic != b"\x93NUMPY":
        raise ScanError(f"{path} is not a .npy array file (no NumPy header: text or another format); write the "
                        "tokens with numpy.save")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc) or "Object arrays" in str(exc):
            raise ScanError(f"{path} holds an array of Python objects, which wtc does not load (unpickling can run "
                            "code); save an integer array") from None
        raise ScanError(f"{path}: cannot read tokens: {_first_line(exc)}") from None
    except Exception as exc:
        raise ScanError(f"{path}: cannot read tokens: {_first_line(exc)}") from None


def _read_pt(path: Path):
    """A .pt tensor loaded with weights_only=True; a raw pickle (or objects past tensors) is refused
    in one line, without torch's warning and its multi-line advice to load it unsafely."""
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise ScanError(f"{path} is not a tensor file wtc loads safely (a raw pickle, or objects other than tensors "
                        "and plain containers; wtc loads .pt with weights_only=True); save it with "
                        "torch.save(tensor, path) or as .npy") from None
    except Exception as exc:
        raise ScanError(f"{path}: cannot read tokens: {_first_line(exc)}") from None
