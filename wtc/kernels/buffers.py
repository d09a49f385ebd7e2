"""Output buffers for the Triton kernels (poisoned under the interpreter and in tests)."""
from __future__ import annotations

import os

import torch

from wtc.backend import interpreting


def output(shape, like: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """An output buffer for a kernel to fill. Under the interpreter or with WTC_POISON=1 (the tests)
    it starts as NaN (or -7 for integers), so an element a kernel forgets to write shows up."""
    if interpreting() or os.environ.get("WTC_POISON") == "1":
        fill = float("nan") if dtype.is_floating_point else -7
        return torch.full(shape, fill, dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)
