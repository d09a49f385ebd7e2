"""Triton kernels for the Discrete Transformer's hot path, and the dispatch that picks them.

    route(...)      fused pointer-head routing: PLE, bilinear score, causal mask, Gumbel noise,
                    temperature softmax (online, over key blocks) and routing, forward + backward
    aggregate(...)  aggregate heads: causal running mean
    mlp_bank(...)   all sub-MLPs of a layer in one launch: gather k inputs, hidden layer, output

Each op lives in its own file (kernels, launcher, autograd.Function); the torch reference in wtc.dt
is the CPU path and the oracle the tests compare against. Dispatch: Triton for CUDA tensors when
triton imports, else the reference; WTC_KERNELS=reference forces the reference, WTC_KERNELS=triton
forces Triton (on CPU tensors only under TRITON_INTERPRET=1, the interpreter). Nothing here imports
triton until an op runs.
"""
from __future__ import annotations

import functools
import importlib
import os

import torch

from wtc import _native


@functools.lru_cache(maxsize=None)
def triton_status() -> tuple[bool, str]:
    """(importable, why not)."""
    try:
        importlib.import_module("triton")
        return True, ""
    except ImportError as exc:
        return False, f"triton is not installed ({exc})"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def output(shape, like: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """An output buffer for a kernel to fill. Under the interpreter or with WTC_POISON=1 (the tests)
    it starts as NaN (or -7 for integers), so an element a kernel forgets to write shows up."""
    if interpreting() or os.environ.get("WTC_POISON") == "1":
        fill = float("nan") if dtype.is_floating_point else -7
        return torch.full(shape, fill, dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether the DT's ops on `tensor` run through the Triton kernels."""
    choice = _native.kernels_override()
    ok, why = triton_status()
    if choice == "triton":
        if not ok:
            raise RuntimeError(f"WTC_KERNELS=triton but {why}")
        if not tensor.is_cuda and not interpreting():
            raise RuntimeError("WTC_KERNELS=triton on CPU tensors needs TRITON_INTERPRET=1 (the Triton "
                               "interpreter), set before wtc.kernels runs its first op")
        return True
    if choice in ("reference", "native"):
        return False
    return ok and tensor.is_cuda


def route(*args, **kwargs):
    """Fused pointer-head routing; see wtc/kernels/routing.py."""
    from wtc.kernels.routing import route as op
    return op(*args, **kwargs)


def aggregate(val: torch.Tensor) -> torch.Tensor:
    """Aggregate heads (..., T) -> causal running mean; see wtc/kernels/routing.py."""
    from wtc.kernels.routing import aggregate as op
    return op(val)


def mlp_bank(*args, **kwargs):
    """All sub-MLPs of a layer in one launch; see wtc/kernels/submlps.py."""
    from wtc.kernels.submlps import mlp_bank as op
    return op(*args, **kwargs)
