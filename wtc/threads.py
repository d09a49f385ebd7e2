"""One way to set torch's intra-op thread count for a block of work.

Tiny models on few cores are overhead-bound: one thread per process is usually fastest and more
processes (attempts, rungs) are the way to use more cores; see bench/RESULTS.md.
"""
from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run the block with n intra-op torch threads (None: leave the setting alone); restored after."""
    if n is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def cores() -> int:
    """Logical cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
