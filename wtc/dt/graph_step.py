"""Hard-phase DT training steps replayed from one CUDA graph.

A hard-phase step of the default model on a GPU is ~18 ms of which the kernels are a small part: the
rest is launching a few hundred small ops one by one from Python (bench/RESULTS.md, session 20). A
CUDA graph records the whole step once — forward, loss, backward and the fused AdamW update — and
replays it with one launch. The hard phase qualifies: its temperature and learning rate are fixed,
it draws no noise, and the structure (which selections are frozen) cannot change within it, so
nothing in the step depends on a value the host would have to read back.

The recipe is torch's whole-network capture: a few eager steps on a side stream first (lazy
initialisation: cuBLAS handles, the optimizer's state, Triton's compilation), then one capture,
then per step a copy of the batch into the graph's static inputs and a replay. Steps that log
entropies (every LOG_EVERY) stay eager: they compute more, and the host reads their results.
A replay runs the same kernels on the same buffers as an eager step, so the trajectory is the eager
one (bench/train_step.py --device cuda compares the parameters after both).

WTC_CUDA_GRAPHS=0 turns it off. A capture that fails (an op that reads the device, a kernel that
cannot be captured) is reported once as a warning and the run continues eagerly, unchanged: capture
records the step, it does not run it.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable

import torch

WARMUP_STEPS = 3   # eager steps on a side stream before the capture, as torch's recipe asks


def enabled(device: torch.device) -> bool:
    """Whether hard-phase steps on `device` are replayed from a CUDA graph (WTC_CUDA_GRAPHS, default on)."""
    value = os.environ.get("WTC_CUDA_GRAPHS", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"WTC_CUDA_GRAPHS={value!r}: use 1 (CUDA graphs for the hard phase, the default) or 0")
    return device.type == "cuda" and value == "1"


class GraphedStep:
    """step(*batch) runs `body(*batch)` — one training step reading only its tensor arguments and
    the module/optimizer state — eagerly for WARMUP_STEPS calls, then from a captured CUDA graph.

    optimizer: its param groups are switched to capturable (the fused AdamW then keeps its step
    counts on the device) for the capture, and back if the capture fails.
    settled: a context manager in which the body reads nothing from the device (for the DT:
    DiscreteTransformer.structure_known); entered around the warm-up steps and the capture, before
    the capture begins, since entering it may read the device. Replays run no Python at all.
    """

    def __init__(self, body: Callable[..., None], optimizer: torch.optim.Optimizer,
                 settled: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        self.body, self.optimizer, self.settled = body, optimizer, settled
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: tuple[torch.Tensor, ...] = ()
        self.warm = 0
        self.failed: str | None = None   # why the capture failed (then every step is eager)

    def step(self, *batch: torch.Tensor) -> None:
        if self.failed is not None:
            self.body(*batch)
            return
        if self.graph is None and self.warm < WARMUP_STEPS:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with self.settled(), torch.cuda.stream(side):
                self.body(*batch)
            torch.cuda.current_stream().wait_stream(side)
            self.warm += 1
            return
        if self.graph is None:
            self._capture(batch)
            if self.graph is None:
                self.body(*batch)
                return
        for dst, src in zip(self.static, batch):
            dst.copy_(src, non_blocking=True)
        self.graph.replay()

    def _capture(self, batch: tuple[torch.Tensor, ...]) -> None:
        groups = self.optimizer.param_groups
        was = [g.get("capturable", False) for g in groups]
        for g in groups:
            g["capturable"] = True
        self.static = tuple(t.clone() for t in batch)
        graph = torch.cuda.CUDAGraph()
        try:
            self.optimizer.zero_grad(set_to_none=True)
            with self.settled(), torch.cuda.graph(graph):
                self.body(*self.static)
        except Exception as exc:        # noqa: BLE001 — any failure means: stay eager, say why
            for g, c in zip(groups, was):
                g["capturable"] = c
            root = exc
            while root.__context__ is not None:   # the capture's own error hides the op that caused it
                root = root.__context__
            self.failed = "; ".join(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                                    for e in dict.fromkeys((root, exc)))
            self.static = ()
            torch.cuda.synchronize()
            warnings.warn(f"CUDA graph capture of the hard-phase step failed; training on eagerly ({self.failed})",
                          RuntimeWarning, stacklevel=3)
            return
        self.graph = graph
