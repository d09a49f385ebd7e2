"""Conditional zero-ablation of the weights of library modules: the models that are not wtc
Transformers (Hugging Face causal LMs through wtc.models.hf, TransformerBridges, any nn.Module
built from nn.Linear, transformers' Conv1D and nn.Embedding).

The definition is wtc.explain.conditional's: a weight zeroed "at positions S" loses its term in the
computations at those positions and the rest of the network runs as usual. Here the term is found
in the output of the module that holds the weight, at the position of that output's row:

    nn.Linear     W[o, i]   y[b, t, o] += W[o, i] * x[b, t, i]
    Conv1D        W[i, o]   y[b, t, o] += W[i, o] * x[b, t, i]     (GPT-2's linear maps)
    nn.Embedding  E[r, c]   y[b, t, c] += E[r, c] where ids[b, t] == r   (token or position ids)

and a forward hook on every module holding the parameter subtracts it where S holds. A tied
parameter (GPT-2's token embedding is also its head) loses every one of its uses at S. Positions
are the module's rows: its input must be (B, T, ...) like the tokens (position ids (1, T) are
broadcast), else the weight is refused. A module whose forward is not its library class's own
(a subclass or an instance override, e.g. Gemma's scaled embedding) holds no weight this can zero:
what its forward computes is not known here.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from wtc.errors import ArgumentError, IndexOutOfRange, UnknownName
from wtc.scan.generic import _kind

_KINDS = ("linear.weight", "conv1d.weight", "embedding.weight")


def _uses(model: nn.Module, param: torch.Tensor) -> list[tuple[str, nn.Module, str | None]]:
    """(module path, module, correction kind or None) for every module holding `param`."""
    out, seen = [], set()
    for path, module in model.named_modules(remove_duplicate=False):
        for leaf, p in module.named_parameters(recurse=False):
            if p is param and (id(module), leaf) not in seen:
                seen.add((id(module), leaf))
                out.append((path, module, _kind(module, leaf)))
    return out


def _zeroable(model: nn.Module, param: torch.Tensor) -> bool:
    uses = _uses(model, param)
    return param.ndim == 2 and bool(uses) and all(kind in _KINDS for _, _, kind in uses)


def matrices(model: nn.Module) -> list[str]:
    """Names of the parameters every use of which is the weight of an nn.Linear, Conv1D or
    nn.Embedding (biases and norm weights are not weights here)."""
    return [name for name, p in model.named_parameters() if _zeroable(model, p)]


def _param(model: nn.Module, name: str) -> torch.Tensor:
    params = dict(model.named_parameters())
    if name not in params:
        raise UnknownName(f"{name!r} is not a parameter of this model")
    p = params[name]
    if not _zeroable(model, p):
        kinds = sorted({type(m).__name__ for _, m, _ in _uses(model, p)})
        raise UnknownName(f"{name!r} ({', '.join(kinds) or 'no module'}) is not a weight conditional ablation can zero "
                          "per position: only the weights of nn.Linear, transformers' Conv1D and nn.Embedding "
                          "modules (their own forward) are")
    return p


def is_local(model: nn.Module, name: str) -> bool:
    """Whether zeroing `name` at a position changes only that position's logits: the model's
    untied output head (nothing after it mixes positions)."""
    p = _param(model, name)
    root = getattr(model, "hf", model)
    head = root.get_output_embeddings() if hasattr(root, "get_output_embeddings") else None
    uses = _uses(model, p)
    return head is not None and len(uses) == 1 and uses[0][1] is head


def _rows(value: torch.Tensor, mask: torch.Tensor, path: str) -> None:
    if value.ndim < 2 or tuple(value.shape[:2]) not in (tuple(mask.shape), (1, mask.shape[1])):
        raise ArgumentError(f"module {path!r} runs on {tuple(value.shape)}, not on rows (B, T, ...) of the tokens "
                            f"{tuple(mask.shape)}: its weights cannot be zeroed per position")


@contextlib.contextmanager
def zeroed_at(model: nn.Module, name: str, index: tuple[int, ...], mask: torch.Tensor, tokens: torch.Tensor):
    """Within the block, model(tokens) runs with weight `name`[index] zeroed at the positions where
    the bool mask (B, T) holds (module docstring)."""
    p = _param(model, name)
    if not isinstance(index, (tuple, list)) or not all(isinstance(i, (int, np.integer)) and
                                                       not isinstance(i, (bool, np.bool_)) for i in index):
        raise ArgumentError(f"index must be a tuple of ints (one per dimension of {name}), got {index!r}")
    index = tuple(int(i) for i in index)
    if len(index) != p.ndim or any(not 0 <= i < s for i, s in zip(index, p.shape)):
        raise IndexOutOfRange(f"index {index} out of range for {name} {tuple(p.shape)}")
    if mask.shape != tokens.shape[:2]:
        raise ArgumentError(f"mask must be shaped like the tokens {tuple(tokens.shape)}, got {tuple(mask.shape)}")
    w = p.detach()[index]

    def hook_for(path: str, kind: str):
        def hook(module, args, out):
            x = args[0]
            _rows(x, mask, path)
            m = mask.to(device=out.device, dtype=out.dtype)
            if kind == "embedding.weight":
                r, c = index
                o, term = c, w * m * (x.expand(mask.shape) == r).to(out.dtype)
            else:
                o, i = index if kind == "linear.weight" else index[::-1]
                term = w * m * x[..., i]
            if out.shape[0] != mask.shape[0]:             # position embeddings (1, T, d): broadcast to the rows
                out = out.expand(mask.shape[0], *out.shape[1:])
            out = out.clone()
            out[..., o] = out[..., o] - term
            return out
        return hook

    handles = []
    try:
        for path, module, kind in _uses(model, p):
            handles.append(module.register_forward_hook(hook_for(path, kind)))
        yield
    finally:
        for h in handles:
            h.remove()


__all__ = ["matrices", "is_local", "zeroed_at"]
