"""Validation of what a scan is given: token ids against the model's vocabulary and context, the
identity of the model and readout a resumable store records.

Token ids are checked before anything runs: a negative id indexes the embedding from its end in
the clean pass (torch accepts -1), so the ablation of that row would miss the position and its KL
would be silently wrong.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import re
import types

import numpy as np
import torch
from torch import nn

from wtc.errors import ScanError

INT64_MAX = np.iinfo(np.int64).max


def as_tokens(tokens, model: nn.Module | None = None, name: str = "tokens") -> torch.Tensor:
    """(B, T) int64 token ids from any integer array or tensor; refuses floats, bools, complex,
    empty arrays, negative ids, ids past the vocabulary and sequences past the context."""
    if isinstance(tokens, torch.Tensor):
        dtype_ok = not (tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool)
        arr = tokens
    else:
        try:
            arr = np.asarray(tokens)
        except Exception as exc:   # ragged lists and the like
            raise ScanError(f"{name} must be an integer array (B, T): {exc}") from None
        dtype_ok = np.issubdtype(arr.dtype, np.integer)
    if not dtype_ok:
        raise ScanError(f"{name} must be an integer tensor or array of token ids (B, T), got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ScanError(f"{name} must have shape (B, T), got {tuple(arr.shape)}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ScanError(f"{name} is empty (shape {tuple(arr.shape)}): a scan needs at least one token")
    if isinstance(arr, np.ndarray):
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > INT64_MAX:
            raise ScanError(f"{name} holds id {int(arr.max())}, beyond int64")
        arr = torch.from_numpy(np.ascontiguousarray(arr).astype(np.int64, copy=False))
    out = arr.long()
    low = int(out.min())
    if low < 0:
        b, t = (int(v) for v in (out == low).nonzero()[0])
        raise ScanError(f"{name} holds a negative token id ({low} at [{b}, {t}]); ids are 0 .. vocab-1")
    if model is not None:
        vocab, ctx = vocab_size(model), context_size(model)
        high = int(out.max())
        if vocab is not None and high >= vocab:
            b, t = (int(v) for v in (out == high).nonzero()[0])
            raise ScanError(f"{name} holds token id {high} at [{b}, {t}], but the model's vocabulary has {vocab} ids")
        if ctx is not None and out.shape[1] > ctx:
            raise ScanError(f"{name} has {out.shape[1]} positions, but the model's context is {ctx}")
    return out


def _config(model: nn.Module):
    return getattr(model, "cfg", None) or getattr(model, "config", None)


def vocab_size(model: nn.Module) -> int | None:
    """d_vocab (wtc, TransformerLens), vocab_size (Hugging Face), else the first nn.Embedding's rows."""
    cfg = _config(model)
    for key in ("d_vocab", "vocab_size"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return emb.num_embeddings if emb is not None else None


def context_size(model: nn.Module) -> int | None:
    """n_ctx (wtc, TransformerLens), n_positions / max_position_embeddings (Hugging Face), or None."""
    cfg = _config(model)
    for key in ("n_ctx", "n_positions", "max_position_embeddings"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def positive_int(value, name: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) or value < 1:
        raise ScanError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def architecture(model: nn.Module) -> dict:
    """What makes two models with equal weights compute different functions: the class, its config
    (a dataclass or a Hugging Face config) and the module tree (activations, norms, their options)."""
    cfg = _config(model)
    if dataclasses.is_dataclass(cfg):
        cfg = dataclasses.asdict(cfg)
    elif hasattr(cfg, "to_dict"):
        cfg = {k: v for k, v in cfg.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    else:
        cfg = None
    kind = type(model)
    return {"class": f"{kind.__module__}.{kind.__qualname__}",
            "config_sha256": _sha(repr(sorted(cfg.items())) if isinstance(cfg, dict) else "none"),
            "modules_sha256": _sha(repr(model))}


def default_readout(out):
    """The logits of a model's output: the output itself, or its .logits (Hugging Face outputs)."""
    if torch.is_tensor(out):
        return out
    if torch.is_tensor(getattr(out, "logits", None)):
        return out.logits
    raise ScanError(f"the model returns {type(out).__name__}, not logits: pass readout= (output -> logits (B, T, V))")


def readout_identity(readout) -> str:
    """'default', or the readout's qualified name and a digest of its code, constants and closure
    (two lambdas differ, and so do two closures over different values)."""
    if readout is None:
        return "default"
    fn = getattr(readout, "__func__", readout)
    code = getattr(fn, "__code__", None)
    if isinstance(readout, functools.partial):      # its function's identity and its bound arguments
        inner = readout_identity(readout.func)
        bound = b"".join(_cell_bytes(v) for v in readout.args) + b"".join(
            k.encode() + _cell_bytes(v) for k, v in sorted(readout.keywords.items()))
        return f"functools.partial:{inner}:{hashlib.sha256(bound).hexdigest()[:16]}"
    if code is None:        # a callable object (e.g. an nn.Module): its type and repr
        return f"{type(readout).__module__}.{type(readout).__qualname__}:{_sha(_stable(repr(readout)))}"
    parts = [code.co_code, _consts_bytes(code), repr(code.co_names).encode()]
    for cell in fn.__closure__ or ():
        try:
            parts.append(_cell_bytes(cell.cell_contents))
        except ValueError:  # an empty cell
            parts.append(b"<empty>")
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    return f"{name}:{hashlib.sha256(b''.join(parts)).hexdigest()[:16]}"


def _consts_bytes(code) -> bytes:
    """A code object's constants as bytes that are the same in every process: a nested code object
    (a comprehension, an inner lambda) is its own code, constants and names, not its repr, which
    holds its memory address (so a readout with a comprehension had another identity after every
    restart, and its scans could never be resumed). Without nested code: repr, as before."""
    if not any(isinstance(c, types.CodeType) for c in code.co_consts):
        return repr(code.co_consts).encode()
    out = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.append(b"<code " + c.co_code + _consts_bytes(c) + repr(c.co_names).encode() + b">")
        else:
            out.append(repr(c).encode())
    return b"(" + b", ".join(out) + b")"


def _stable(text: str) -> str:
    """A repr without memory addresses ('<function f at 0x7f..>'), which differ from run to run."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's bytes as numpy's tobytes() gives them, for every dtype (numpy has no bfloat16)."""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def model_sha256(model: nn.Module) -> str:
    """sha256 of the model's state dict (names and exact bytes, in name order): the identity of its
    weights, which two trainings of one recipe on different CPUs need not share."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor_bytes(p))
    return h.hexdigest()


def hooks_identity(model: nn.Module) -> str | None:
    """None when no forward (pre-)hook is registered on the model or its submodules; else a digest
    of where each one is and what it is (its code, constants and closure, as for a readout): a hook
    changes the function scanned, so a store resumed with other hooks (or none) would mix two."""
    parts = []
    for name, module in model.named_modules():
        for kind, hooks in (("pre", module._forward_pre_hooks), ("post", module._forward_hooks)):
            for fn in hooks.values():
                parts.append(f"{name}:{kind}:{readout_identity(fn)}")
    return _sha("\n".join(parts)) if parts else None


def _cell_bytes(value) -> bytes:
    if isinstance(value, torch.Tensor):
        return tensor_bytes(value)
    if isinstance(value, np.ndarray):
        return value.tobytes()
    if inspect.isfunction(value) or isinstance(value, functools.partial):
        return readout_identity(value).encode()
    return _stable(repr(value)).encode()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
